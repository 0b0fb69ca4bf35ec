"""A `cuda` solution's launch plan for one workload: what its `launch.py` asked of the GPU in one
call, in order, with every tensor named as a buffer of the call (an input, an output, or scratch
the call allocated) and every scalar by value and width.

The plan is written by the candidate's child (untrusted) and read by the evaluator: `validate`
checks it against CUDA's launch limits and the cubin's own kernels before anything replays it,
and `differences` says in words how two recordings of one workload differ.
"""

from __future__ import annotations

import struct
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_STEPS = 256  # launches and fills per call
MAX_ARGS = 128  # arguments per launch
MAX_SCRATCH = 64  # scratch buffers per call
MAX_SCRATCH_BYTES = 16 << 30  # all scratch of a call together
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
MAX_THREADS_PER_BLOCK = 1024
MAX_SHARED_MEM_BYTES = 227 << 10  # the opt-in maximum of sm_90 (H100, H200)
MAX_NAME_CHARS = 1024
RECORDED_SETS = 2  # a workload is recorded on its first two correctness rounds' input sets
SCALAR_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                 "float16", "float32", "float64")
FILL_DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64")

BufferKind = Literal["input", "output", "scratch"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")


class BufferArg(_Frozen):
    """A pointer into one of the call's buffers: an input or output by name, scratch by index."""
    kind: BufferKind
    name: str | None = None  # inputs and outputs
    index: int | None = None  # scratch
    offset_bytes: int = Field(0, ge=0)

    def key(self) -> tuple[str, str | int]:
        return (self.kind, self.index if self.kind == "scratch" else self.name)


class ScalarArg(_Frozen):
    """A value passed by width (`dtype`, numpy's name): as recorded, or the call's scalar input `input`."""
    kind: Literal["scalar"] = "scalar"
    dtype: Literal[SCALAR_DTYPES]
    value: int | float
    input: str | None = None  # the value is this scalar input's, whatever it is in a later call


Arg = Annotated[BufferArg | ScalarArg, Field(discriminator="kind")]


class Launch(_Frozen):
    op: Literal["launch"] = "launch"
    kernel: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem_bytes: int = Field(0, ge=0)
    args: list[Arg] = Field(default_factory=list, max_length=MAX_ARGS)


class Fill(_Frozen):
    """torch's `zero_` / `fill_` of a contiguous region of an output or of scratch."""
    op: Literal["fill"] = "fill"
    buffer: BufferArg
    size_bytes: int = Field(ge=0)
    dtype: Literal[FILL_DTYPES]
    value: int | float | bool


Step = Annotated[Launch | Fill, Field(discriminator="op")]


class Scratch(_Frozen):
    index: int = Field(ge=0)
    size_bytes: int = Field(ge=0)


class Returned(_Frozen):
    """A tensor the call returned (destination_passing_style false): a view of one of its buffers."""
    buffer: BufferArg
    dtype: Literal[FILL_DTYPES]
    shape: list[int] = Field(max_length=16)
    stride: list[int] = Field(max_length=16)


class Plan(_Frozen):
    """One workload's launch plan. `refused` says why it cannot be replayed (tensor work on the
    host, a pointer to no buffer of the call, ...); such a plan is never replayed."""
    steps: list[Step] = Field(default_factory=list, max_length=MAX_STEPS)
    scratch: list[Scratch] = Field(default_factory=list, max_length=MAX_SCRATCH)
    returned: list[Returned] | None = None
    refused: str | None = None


class PlanInvalid(ValueError):
    """A plan that must not be replayed: out of CUDA's limits, or not this call's."""


def parse(data: object) -> Plan:
    try:
        return Plan.model_validate(data)
    except ValidationError as error:
        raise PlanInvalid(f"not a launch plan: {_first_error(error)}") from None


def validate(plan: Plan, kernels: frozenset[str], sizes: dict[tuple[str, str], int],
             scalar_inputs: frozenset[str] = frozenset()) -> None:
    """Raises PlanInvalid where `plan` breaks a limit, names a kernel that is not among `kernels`
    (the cubin's), or points outside its buffers: `sizes` maps ("input"|"output", name) to each
    tensor buffer's bytes, as the evaluator knows them from the definition and the workload;
    `scalar_inputs` names the inputs that are scalars."""
    scratch = {s.index: s.size_bytes for s in plan.scratch}
    if sorted(scratch) != list(range(len(plan.scratch))):
        raise PlanInvalid("scratch buffers must be numbered 0, 1, ... once each")
    if sum(scratch.values()) > MAX_SCRATCH_BYTES:
        raise PlanInvalid(f"{sum(scratch.values())} bytes of scratch, more than {MAX_SCRATCH_BYTES}")
    limits = {("scratch", i): n for i, n in scratch.items()} | dict(sizes)
    for number, step in enumerate(plan.steps):
        where = f"step {number}"
        if isinstance(step, Fill):
            if step.buffer.kind == "input":
                raise PlanInvalid(f"{where}: a fill of input `{step.buffer.name}` (inputs are read-only)")
            _check_ref(step.buffer, limits, where, step.size_bytes)
            itemsize = np.dtype(_numpy_name(step.dtype)).itemsize
            if step.size_bytes % itemsize or step.buffer.offset_bytes % itemsize:
                raise PlanInvalid(f"{where}: a fill of {step.dtype} at offset {step.buffer.offset_bytes} over "
                                  f"{step.size_bytes} bytes is not whole elements")
            continue
        if step.kernel not in kernels:
            raise PlanInvalid(f"{where}: kernel `{step.kernel[:120]}` is not a kernel of the cubin")
        _check_launch(step, where)
        for k, arg in enumerate(step.args):
            if isinstance(arg, BufferArg):
                _check_ref(arg, limits, f"{where}, argument {k}", 0)
            else:
                _check_scalar(arg, scalar_inputs, f"{where}, argument {k}")
    for k, returned in enumerate(plan.returned or []):
        itemsize = np.dtype(_numpy_name(returned.dtype)).itemsize
        if len(returned.shape) != len(returned.stride) or min(returned.shape, default=0) < 0:
            raise PlanInvalid(f"returned tensor {k}: shape {returned.shape} and stride {returned.stride} do not match")
        extent = 0 if 0 in returned.shape else \
            (1 + sum((n - 1) * abs(s) for n, s in zip(returned.shape, returned.stride))) * itemsize
        if returned.buffer.offset_bytes % itemsize:
            raise PlanInvalid(f"returned tensor {k}: offset {returned.buffer.offset_bytes} is not a multiple of "
                              f"its element size")
        if any(s < 0 for s in returned.stride):
            raise PlanInvalid(f"returned tensor {k}: negative strides")
        _check_ref(returned.buffer, limits, f"returned tensor {k}", extent)


def _check_launch(step: Launch, where: str) -> None:
    for name, dims, top in (("grid", step.grid, MAX_GRID), ("block", step.block, MAX_BLOCK)):
        if any(d < 1 or d > t for d, t in zip(dims, top)):
            raise PlanInvalid(f"{where}: {name} {dims} is outside CUDA's limits (1 to {top})")
    if step.block[0] * step.block[1] * step.block[2] > MAX_THREADS_PER_BLOCK:
        raise PlanInvalid(f"{where}: block {step.block} has more than {MAX_THREADS_PER_BLOCK} threads")
    if step.shared_mem_bytes > MAX_SHARED_MEM_BYTES:
        raise PlanInvalid(f"{where}: {step.shared_mem_bytes} bytes of dynamic shared memory, more than "
                          f"{MAX_SHARED_MEM_BYTES}")


def _check_ref(ref: BufferArg, limits: dict, where: str, extent: int) -> None:
    scratch = ref.kind == "scratch"
    if (ref.index is None, ref.name is None) != (not scratch, scratch):
        raise PlanInvalid(f"{where}: a {ref.kind} buffer is named by {'index' if scratch else 'name'} alone")
    size = limits.get(ref.key())
    if size is None:
        raise PlanInvalid(f"{where}: no {ref.kind} buffer {ref.key()[1]!r} in this call")
    if ref.offset_bytes + extent > size:
        raise PlanInvalid(f"{where}: offset {ref.offset_bytes} (+{extent} bytes) is outside {ref.kind} "
                          f"{ref.key()[1]!r} of {size} bytes")


def _check_scalar(arg: ScalarArg, scalar_inputs: frozenset[str], where: str) -> None:
    if arg.input is not None:
        if arg.input not in scalar_inputs:
            raise PlanInvalid(f"{where}: no scalar input `{arg.input[:80]}` in this call")
        return
    if isinstance(arg.value, float) and not arg.dtype.startswith("float"):
        raise PlanInvalid(f"{where}: a float value for a {arg.dtype}")
    if not arg.dtype.startswith("float"):
        info = np.iinfo(arg.dtype)
        if not info.min <= arg.value <= info.max:
            raise PlanInvalid(f"{where}: {arg.value} does not fit a {arg.dtype}")


def _numpy_name(dtype: str) -> str:
    return "uint16" if dtype == "bfloat16" else dtype


def differences(first: Plan, second: Plan, limit: int = 3) -> list[str]:
    """How two recordings of one workload differ, in words (empty: the same plan)."""
    said: list[str] = []
    if first.refused != second.refused:
        said.append(f"one recording was refused ({first.refused or second.refused}), the other not")
    if len(first.steps) != len(second.steps):
        said.append(f"{len(first.steps)} launches and fills in one call, {len(second.steps)} in the other")
    for number, (a, b) in enumerate(zip(first.steps, second.steps)):
        if a != b:
            said.append(f"step {number}: {_step_text(a)} in one call, {_step_text(b)} in the other")
    if first.scratch != second.scratch:
        said.append(f"scratch {_scratch_text(first)} in one call, {_scratch_text(second)} in the other")
    if first.returned != second.returned:
        said.append("the returned tensors differ")
    return said[:limit] + ([f"and {len(said) - limit} more"] if len(said) > limit else [])


def _step_text(step: Launch | Fill) -> str:
    if isinstance(step, Fill):
        return f"fill of {_ref_text(step.buffer)} ({step.size_bytes} bytes) with {step.value}"
    args = ", ".join(_ref_text(a) if isinstance(a, BufferArg) else f"{a.value} ({a.dtype})" for a in step.args[:8])
    more = ", ..." if len(step.args) > 8 else ""
    return (f"{step.kernel[:80]}({args}{more}) grid {step.grid} block {step.block}"
            f"{f' shared {step.shared_mem_bytes}' if step.shared_mem_bytes else ''}")


def _ref_text(ref: BufferArg) -> str:
    name = f"scratch {ref.index}" if ref.kind == "scratch" else f"{ref.kind} {ref.name}"
    return name + (f"+{ref.offset_bytes}" if ref.offset_bytes else "")


def _scratch_text(plan: Plan) -> str:
    return "[" + ", ".join(f"{s.size_bytes} bytes" for s in plan.scratch) + "]"


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"[:300]


# --- the cubin's kernels --------------------------------------------------------------------------

_STT_FUNC, _STB_GLOBAL, _STO_CUDA_ENTRY, _SHT_SYMTAB = 2, 1, 0x10, 2


def cubin_kernels(cubin: bytes) -> frozenset[str]:
    """The names of the kernels (`__global__` entries) a cubin defines, read from its ELF symbol
    table: global functions marked as CUDA entries (the names `cuModuleGetFunction` finds).
    Raises ValueError where `cubin` is not a 64-bit little-endian ELF file."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2 or cubin[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    try:
        shoff, = struct.unpack_from("<Q", cubin, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", cubin, 0x3A)
        sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
        names: set[str] = set()
        for _name, kind, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
            if kind != _SHT_SYMTAB or entsize < 24:
                continue
            strings = sections[link][4]
            for at in range(offset, offset + size, entsize):
                name_at, info, other = struct.unpack_from("<IBB", cubin, at)
                if info & 0xF == _STT_FUNC and info >> 4 == _STB_GLOBAL and other & _STO_CUDA_ENTRY:
                    end = cubin.index(b"\0", strings + name_at)
                    names.add(cubin[strings + name_at:end].decode("utf-8", "replace"))
    except (struct.error, IndexError) as error:
        raise ValueError(f"a malformed ELF file: {error}") from None
    return frozenset(names)

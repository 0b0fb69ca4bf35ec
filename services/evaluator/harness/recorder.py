"""The recording `kernels` handle: what a `cuda` solution's `launch.py` asks of the GPU in one call,
written down as a launch plan (`plan.Plan`) instead of launched. Runs in the candidate's sandboxed
child, which stays untrusted: the evaluator validates what comes out (`plan.validate`) and records
each workload twice, on input sets of other values, to see host logic that depends on data.

    plan = record_call(function, inputs, outputs, kernel_names)

The handle has `launch.Kernels`'s surface (`kernels.NAME(*args, grid=, block=, shared_mem=)`,
`defines`, `stream`). A tensor argument is named by address: the input, output or scratch buffer
whose bytes hold its `data_ptr()`, and the offset into it; a tensor the call allocated (`torch.empty`
and friends) is scratch. While the call runs, torch's operators are watched (a dispatch mode):
allocations, views and fills of an output or scratch with a constant (`zero_`, `fill_`, torch's
`zeros`/`full`) are recorded or let through; any other operator is tensor work done by the host,
and the plan is refused (not replayable), saying which operator ran.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from services.evaluator.timer.plan import (
    SCALAR_DTYPES, BufferArg, Fill, Launch, Plan, Returned, ScalarArg, Scratch,
)

aten = torch.ops.aten
_ALLOCATIONS = {aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
                aten.new_empty.default, aten.new_empty_strided.default}
# Allocations filled with a constant: the constant's position among the arguments (None: zero, one).
_FILLED = {aten.zeros.default: 0, aten.zeros_like.default: 0, aten.new_zeros.default: 0,
           aten.ones.default: 1, aten.ones_like.default: 1, aten.new_ones.default: 1,
           aten.full.default: "arg1", aten.full_like.default: "arg1", aten.new_full.default: "arg2"}
_FILLS = {aten.zero_.default, aten.fill_.Scalar}
_METADATA = {aten.detach.default, aten.alias.default, aten.lift_fresh.default}


class Refused(Exception):
    """The call cannot be replayed; the message says why, for the writer."""


class RecordingKernels:
    """`launch.Kernels` for the record step: the cubin's kernel names, no GPU work."""

    def __init__(self, names: frozenset[str]) -> None:
        self._names = names
        self._recording: _Recording | None = None

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._names:
            raise AttributeError(f"the cubin has no kernel `{name}` (kernels must be extern \"C\" __global__)")

        def launch(*args: Any, grid: tuple[int, ...] | int, block: tuple[int, ...] | int, shared_mem: int = 0) -> None:
            recording = self._recording
            if recording is None:
                raise RuntimeError("kernels launch only inside the evaluator's call")
            try:
                recording.launch(name, args, grid, block, shared_mem)
            except Refused as refused:  # refused even where the solution catches the exception
                recording.refuse(str(refused))
                raise

        return launch

    def defines(self, name: str) -> bool:
        return name in self._names

    def stream(self) -> None:
        return None

    def pycuda_stream(self) -> None:
        return None


def record_call(function: Callable[..., Any], inputs: dict[str, Any], outputs: dict[str, torch.Tensor] | None,
                kernels: RecordingKernels, output_names: list[str] | None = None) -> Plan:
    """One call of `function(*inputs, *outputs, kernels=kernels)` (outputs None: destination-passing
    style off, the call returns its outputs; a dict of them is read in `output_names`' order) recorded
    as a plan. Refused plans say why in `refused`; an exception of the solution's own propagates (it
    would fail in its own process too)."""
    recording = _Recording(inputs, outputs or {})
    kernels._recording = recording
    try:
        with _Watch(recording):
            returned = function(*inputs.values(), *(outputs or {}).values(), kernels=kernels)
        returns = None if outputs is not None else recording.returned(returned, output_names)
    except Refused as refused:
        recording.refuse(str(refused))
        returns = None
    finally:
        kernels._recording = None
    return recording.plan(returns)


class _Recording:
    def __init__(self, inputs: dict[str, Any], outputs: dict[str, torch.Tensor]) -> None:
        self.steps: list[Launch | Fill] = []
        self.refused: str | None = None
        self.allocated: list[torch.Tensor] = []  # held until the call ends: no address is reused meanwhile
        self._scratch: dict[int, int] = {}  # allocation number -> scratch index (by first use)
        self._named = [("input", n, t) for n, t in inputs.items() if isinstance(t, torch.Tensor)] + \
                      [("output", n, t) for n, t in outputs.items()]
        self._scalars = {n: v for n, v in inputs.items() if not isinstance(v, torch.Tensor)}
        self.device = next((t.device for _k, _n, t in self._named), None)

    def refuse(self, why: str) -> None:
        if self.refused is None:
            self.refused = why

    def launch(self, name: str, args: tuple, grid, block, shared_mem: int) -> None:
        recorded = [self._argument(k, a) for k, a in enumerate(args)]
        self.steps.append(Launch(kernel=name, grid=_dim3(grid), block=_dim3(block),
                                 shared_mem_bytes=int(shared_mem), args=recorded))

    def fill(self, tensor: torch.Tensor, value: Any) -> None:
        ref = self.resolve(tensor, "a fill")
        if ref.kind == "input":
            raise Refused(f"the call fills input `{ref.name}` (inputs are read-only)")
        if not tensor.is_contiguous():
            raise Refused("the call fills a tensor that is not contiguous (only a fill of a contiguous "
                          "region of an output or of scratch is replayed)")
        if isinstance(value, torch.Tensor):
            raise Refused("the call fills a tensor with the value of another tensor")
        self.steps.append(Fill(buffer=ref, size_bytes=tensor.numel() * tensor.element_size(),
                               dtype=str(tensor.dtype).removeprefix("torch."), value=value))

    def resolve(self, tensor: torch.Tensor, what: str) -> BufferArg:
        """The buffer of the call that holds `tensor`'s first byte: by identity, then by address."""
        if self.device is not None and tensor.device != self.device:
            raise TypeError(f"a tensor passed to a kernel must be on {self.device}, not {tensor.device}")
        for kind, key, base in self._buffers():
            if tensor is base or tensor._base is base:
                return self._ref(kind, key, tensor.data_ptr() - base.data_ptr())
        ref = self._by_address(tensor.data_ptr())
        if ref is None:
            raise Refused(f"{what} on a tensor that is none of the call's inputs, outputs or scratch it "
                          f"allocated (a tensor kept from an earlier call or made at import: allocate "
                          f"scratch in each call; the timer allocates it once per workload)")
        return ref

    def returned(self, value: Any, names: list[str] | None) -> list[Returned]:
        if isinstance(value, dict):
            values = [value.get(n) for n in names] if names is not None else list(value.values())
        else:
            values = list(value) if isinstance(value, (tuple, list)) else [value]
        out = []
        for k, tensor in enumerate(values):
            if not isinstance(tensor, torch.Tensor):
                raise Refused(f"returned value {k} is not a tensor ({type(tensor).__name__})")
            out.append(Returned(buffer=self.resolve(tensor, f"returned value {k}"),
                                dtype=str(tensor.dtype).removeprefix("torch."),
                                shape=list(tensor.shape), stride=list(tensor.stride())))
        return out

    def plan(self, returns: list[Returned] | None) -> Plan:
        sizes = {index: _storage_bytes(self.allocated[n]) for n, index in self._scratch.items()}
        scratch = [Scratch(index=i, size_bytes=sizes[i]) for i in sorted(sizes)]
        if self.refused is not None:
            return Plan(refused=self.refused[:2000])
        return Plan(steps=self.steps, scratch=scratch, returned=returns)

    def _argument(self, position: int, value: Any) -> BufferArg | ScalarArg:
        if isinstance(value, torch.Tensor):
            return self.resolve(value, f"kernel argument {position}")
        for name, scalar in self._scalars.items():
            if value is scalar and isinstance(value, (int, float)):
                return ScalarArg(dtype=_scalar_dtype(value), value=_scalar_value(value), input=name)
        if isinstance(value, np.uint64):  # np.uintp: the launcher passes it as a pointer
            ref = self._by_address(int(value))
            if ref is None:
                raise Refused(f"kernel argument {position} is a pointer ({int(value):#x}) into none of the "
                              f"call's buffers")
            return ref
        if isinstance(value, (np.integer, int)) and not isinstance(value, bool) and int(value) > 1 << 32 \
                and self._by_address(int(value)) is not None:
            raise Refused(f"kernel argument {position} is an integer that is the address of a buffer of the "
                          f"call: pass the tensor (or numpy.uintp) so that the timer can point it at its own")
        return ScalarArg(dtype=_scalar_dtype(value), value=_scalar_value(value))

    def _buffers(self):
        yield from self._named
        for n, tensor in enumerate(self.allocated):
            yield "scratch", n, tensor

    def _by_address(self, address: int) -> BufferArg | None:
        for kind, key, base in self._buffers():
            start = base.data_ptr()
            size = _storage_bytes(base) if kind == "scratch" else base.numel() * base.element_size()
            if size and start <= address < start + size:
                return self._ref(kind, key, address - start)
        return None

    def _ref(self, kind: str, key: str | int, offset: int) -> BufferArg:
        if kind != "scratch":
            return BufferArg(kind=kind, name=key, offset_bytes=offset)
        index = self._scratch.setdefault(key, len(self._scratch))
        return BufferArg(kind="scratch", index=index, offset_bytes=offset)


class _Watch(TorchDispatchMode):
    """torch's operators during the call: allocations become scratch, fills steps, views pass;
    anything else is tensor work on the host and refuses the plan (the call still runs)."""

    def __init__(self, recording: _Recording) -> None:
        super().__init__()
        self.recording = recording

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if func in _ALLOCATIONS:
            self.recording.allocated.append(result)
        elif func in _FILLED:
            self.recording.allocated.append(result)
            where = _FILLED[func]
            self._fill(result, where if isinstance(where, int) else args[int(where[3:])])
        elif func in _FILLS:
            self._fill(args[0], 0 if func is aten.zero_.default else args[1])
        elif not (func.is_view or func in _METADATA):
            self.recording.refuse(f"the host code ran torch's `{func}` on tensors during the call (tensor "
                                  f"work outside the cubin's kernels, or a value read back from the GPU)")
        return result

    def _fill(self, tensor: torch.Tensor, value: Any) -> None:
        try:
            self.recording.fill(tensor, value)
        except Refused as refused:
            self.recording.refuse(str(refused))


def _scalar_dtype(value: Any) -> str:
    """The width the launcher gives a value (`launch._argument`): Python ints and bools as int32,
    floats as float32, numpy scalars as their own type."""
    if isinstance(value, (bool, int)) and not isinstance(value, np.generic):
        if not -2**31 <= int(value) < 2**31:
            raise OverflowError(f"Python int {value} does not fit the int32 it is passed as (use numpy.int64)")
        return "int32"
    if isinstance(value, float):
        return "float32"
    if isinstance(value, np.generic) and value.dtype.name in SCALAR_DTYPES:
        return value.dtype.name
    raise TypeError(f"a kernel argument of type {type(value).__name__}: pass tensors, ints, floats or "
                    f"numpy scalars")


def _scalar_value(value: Any) -> int | float:
    if isinstance(value, float) or (isinstance(value, np.generic) and value.dtype.kind == "f"):
        return float(np.float32(value)) if isinstance(value, float) else float(value)
    return int(value)


def _storage_bytes(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().nbytes() - tensor.storage_offset() * tensor.element_size()


def _dim3(dims: tuple[int, ...] | int) -> tuple[int, int, int]:
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    if not 1 <= len(dims) <= 3:
        raise ValueError(f"grid and block take 1 to 3 dimensions, not {len(dims)}")
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))

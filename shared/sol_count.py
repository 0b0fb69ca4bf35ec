"""Counting a workload's work for the SOL model (`shared.sol` prices it).

The reference runs under the dispatch modes of `shared.sol_record`, on meta tensors built from the
workload's resolved shapes (nothing is allocated, whatever the shapes), else on fake CUDA tensors
(FakeTensorMode: shapes only, "cuda" without a GPU), else on CPU with real tensors when it needs
values (`.item()`, data-dependent shapes) and its inputs fit the budget; `shared.sol_bounded`
runs this in a child with a memory and a time limit:
- matrix FLOPs: every op in torch's FLOP table (`torch.utils.flop_counter.flop_registry`, the
  formulas `FlopCounterMode` uses), priced later at the narrowest float dtype among the
  definition's inputs, the op's operands and any fp8/fp4 tensor made before it. Two calls are
  counted whole instead of as the ops they lower to: a two-operand einsum (broadcast repeats left
  out) and scaled_dot_product_attention (the causal half left out);
- vector FLOPs: one per output element of every other computing op (per input element for a
  reduction); views, copies, casts, gathers and factories count none;
- bytes: each input storage's footprint (the union of what the reference reads of it, each element
  once; a gather counts the rows it fetches, each distinct row once when the indices are the
  problem's own values), plus the definition's outputs written once; formulas (`sol` in the
  definition) replace either figure.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree

from shared.errors import KernelSwarmError
from shared.hardware import Precision
from shared.schema import CustomInput, Definition, SafetensorsInput, ScalarInput, Workload
from shared.schema.definition import DType, evaluate_sol_expression
from shared.sol_record import FAKE_CUDA, FunctionCounter, InputStorage, WorkRecorder, narrowest, storage_key

DEFAULT_CPU_BUDGET_BYTES = 1 << 30
META, CPU = torch.device("meta"), torch.device("cpu")


class SolCountError(KernelSwarmError):
    """The workload's work cannot be counted (missing data, a reference that runs nowhere)."""


# --- dtypes -------------------------------------------------------------------------------------

_SCHEMA_PRECISION = {
    DType.FLOAT64: Precision.FP64, DType.FLOAT32: Precision.FP32, DType.BFLOAT16: Precision.BF16,
    DType.FLOAT16: Precision.FP16, DType.FLOAT8_E4M3FN: Precision.FP8, DType.FLOAT8_E5M2: Precision.FP8,
    DType.FLOAT4_E2M1: Precision.FP4, DType.FLOAT4_E2M1FN_X2: Precision.FP4,
}
SCHEMA_TORCH = {
    DType.FLOAT64: torch.float64, DType.FLOAT32: torch.float32, DType.FLOAT16: torch.float16,
    DType.BFLOAT16: torch.bfloat16, DType.FLOAT8_E4M3FN: torch.float8_e4m3fn,
    DType.FLOAT8_E5M2: torch.float8_e5m2, DType.INT64: torch.int64, DType.INT32: torch.int32,
    DType.INT16: torch.int16, DType.INT8: torch.int8, DType.BOOL: torch.bool,
    DType.FLOAT4_E2M1: torch.uint8, DType.FLOAT4_E2M1FN_X2: getattr(torch, "float4_e2m1fn_x2", torch.uint8),
}
_QUANT_IN_SOURCE = re.compile(r"torch\.(float8_e4m3fn|float8_e5m2|float8_e4m3fnuz|float8_e5m2fnuz|float4_e2m1fn_x2)\b")


def input_precision(definition: Definition) -> Precision:
    """The narrowest float dtype among the definition's inputs (fp32 when none is a float)."""
    return narrowest(_SCHEMA_PRECISION.get(s.dtype) for s in definition.inputs.values()) or Precision.FP32


def solar_precision(definition: Definition) -> Precision:
    """SOLAR's rate class for a problem: fp4 or fp8 when such a dtype appears in the inputs or the
    reference's source, else the 16-bit rate (fp32 priced as fp16, the leaderboard setup)."""
    found = {m.group(1) for m in _QUANT_IN_SOURCE.finditer(definition.reference)}
    found |= {s.dtype.value for s in definition.inputs.values()}
    if any(name.startswith("float4") for name in found):
        return Precision.FP4
    if any(name.startswith("float8") for name in found):
        return Precision.FP8
    return Precision.FP16


# --- counting -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class WorkCount:
    """Hardware-independent work of one workload."""

    matrix_flops: Mapping[Precision, int]  # by the precision it is priced at (before fp32 -> tf32)
    vector_flops: int
    read_bytes: int  # compulsory input traffic at the inputs' dtypes
    write_bytes: int  # outputs at their dtypes
    read_elements: int  # the same, in elements (SOLAR prices elements at one width)
    write_elements: int
    input_precision: Precision
    solar_precision: Precision
    counted_on: str  # "meta", "cpu" or "formula"
    unread_inputs: tuple[str, ...] = ()
    bool_elements: int = 0  # of read and write elements, those of bool tensors (SOLAR leaves masks out)

    @property
    def total_matrix_flops(self) -> int:
        return sum(self.matrix_flops.values())

    @property
    def bytes_moved(self) -> int:
        return self.read_bytes + self.write_bytes


def load_reference(definition: Definition) -> ModuleType:
    """The reference as a module (trusted code: it runs in this process)."""
    name = f"kernelswarm_sol_reference_{re.sub(r'[^0-9A-Za-z_]', '_', definition.name)}"
    module = ModuleType(name)
    module.__file__ = f"<reference {definition.name}>"
    sys.modules[name] = module
    exec(compile(definition.reference, module.__file__, "exec"), module.__dict__)  # noqa: S102
    return module


def count_work(definition: Definition, workload: Workload, problem_root: Path | None = None, *,
               use_formulas: bool = True, cpu_budget_bytes: int = DEFAULT_CPU_BUDGET_BYTES,
               reference: ModuleType | None = None) -> WorkCount:
    """Count one workload's work: from the definition's `sol` formulas where given (and
    `use_formulas`), else by running the reference on meta tensors, else on CPU."""
    axes = definition.resolve_axes(workload.axes)
    formulas = definition.sol if use_formulas else None
    if formulas is not None and formulas.flops is not None and formulas.bytes is not None:
        return _from_formulas(definition, axes)
    traced = _trace(definition, workload, axes, problem_root, cpu_budget_bytes,
                    reference or load_reference(definition))
    if formulas is not None and (formulas.flops is not None or formulas.bytes is not None):
        formula_count = _from_formulas(definition, axes)
        if formulas.flops is not None:
            traced = replace(traced, matrix_flops=formula_count.matrix_flops, vector_flops=0)
        if formulas.bytes is not None:
            traced = replace(traced, read_bytes=formula_count.read_bytes, write_bytes=0)
        return replace(traced, counted_on=f"{traced.counted_on}+formula")
    return traced


def _from_formulas(definition: Definition, axes: dict[str, int]) -> WorkCount:
    precision = input_precision(definition)
    formulas = definition.sol
    tensors = {name: (math.prod(definition.shape_of(spec, axes) or ()), _itemsize(spec.dtype))
               for name, spec in (definition.inputs | definition.outputs).items()}
    try:
        flops = int(evaluate_sol_expression(formulas.flops, axes, tensors)) if formulas.flops else 0
        moved = int(evaluate_sol_expression(formulas.bytes, axes, tensors)) if formulas.bytes else 0
    except (ValueError, ArithmeticError, NameError) as error:
        raise SolCountError(f"the definition's sol formulas cannot be evaluated for {axes}: {error}") from None
    if flops < 0 or moved < 0:
        raise SolCountError(f"the definition's sol formulas give negative work for {axes}")
    return WorkCount(MappingProxyType({precision: flops}), 0, moved, 0, 0, 0, precision,
                     solar_precision(definition), "formula")


def _trace(definition: Definition, workload: Workload, axes: dict[str, int], problem_root: Path | None,
           cpu_budget_bytes: int, reference: ModuleType) -> WorkCount:
    specs = list(workload.inputs.values())
    needs_files = [s for s in specs if isinstance(s, SafetensorsInput)]
    missing = [s.path for s in needs_files if not _blob_path(s, problem_root).exists()]
    if missing:
        raise SolCountError(f"inputs need safetensors files that are not there: {', '.join(sorted(set(missing)))}")
    fits_cpu = _input_bytes(definition, axes) <= cpu_budget_bytes
    cpu_inputs: dict[str, Any] | None = None
    meta_error = "its inputs come from safetensors files (real data)"
    if not needs_files:
        try:
            try:
                inputs = _make_inputs(META, definition, workload, axes, problem_root, reference)
            except Exception:  # noqa: BLE001 - a custom input maker that needs real values
                if not fits_cpu:
                    raise
                cpu_inputs = _make_inputs(CPU, definition, workload, axes, problem_root, reference)
                inputs = {n: v.to(META) if isinstance(v, torch.Tensor) else v for n, v in cpu_inputs.items()}
            return _run_counted(definition, axes, inputs, reference, "meta")
        except Exception as error:  # noqa: BLE001 - any failure on meta means: try fake CUDA tensors
            meta_error = f"{type(error).__name__}: {_first_line(error)}"
        try:
            return _count_on_fake(definition, workload, axes, problem_root, reference)
        except Exception as error:  # noqa: BLE001 - any failure there means: try real tensors
            meta_error += f"; on fake CUDA tensors: {type(error).__name__}: {_first_line(error)}"
    if not fits_cpu:
        raise SolCountError(f"cannot count on meta tensors ({meta_error}) and the CPU fallback needs "
                            f"{_input_bytes(definition, axes) / 2**30:.1f} GiB of inputs, over the "
                            f"{cpu_budget_bytes / 2**30:.1f} GiB budget")
    try:
        if cpu_inputs is None:
            cpu_inputs = _make_inputs(CPU, definition, workload, axes, problem_root, reference)
        return _run_counted(definition, axes, cpu_inputs, reference, "cpu", real_indices=_indices_are_real(definition, workload))
    except Exception as error:  # noqa: BLE001 - reported with both causes
        raise SolCountError(f"cannot count on meta tensors ({meta_error}) nor on CPU "
                            f"({type(error).__name__}: {_first_line(error)})") from error


def _count_on_fake(definition: Definition, workload: Workload, axes: dict[str, int], problem_root: Path | None,
                   reference: ModuleType) -> WorkCount:
    """Shapes only, on fake CUDA tensors (torch's FakeTensorMode, no GPU needed): for references
    that make tensors on "cuda" or call ops the meta device lacks; values still do not exist, so
    `.item()` and data-dependent shapes fail here as on meta."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        inputs = _make_inputs(FAKE_CUDA, definition, workload, axes, problem_root, reference)
        return _run_counted(definition, axes, inputs, reference, "fake", on_fake=True)


def _indices_are_real(definition: Definition, workload: Workload) -> bool:
    """Whether every integer tensor input comes from the problem (its custom maker or a data file):
    ours are zeros, whose gathers touch one row."""
    return all(isinstance(workload.inputs[name], (CustomInput, SafetensorsInput))
               for name, spec in definition.inputs.items()
               if spec.shape is not None and spec.dtype not in _SCHEMA_PRECISION and spec.dtype is not DType.BOOL)


def _run_counted(definition: Definition, axes: dict[str, int], inputs: dict[str, Any], reference: ModuleType,
                 counted_on: str, on_fake: bool = False, real_indices: bool = False) -> WorkCount:
    bases: dict[int, InputStorage] = {}
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor) and (key := storage_key(value)) is not None:
            base = bases.setdefault(key, InputStorage([], value.element_size(), value.untyped_storage().nbytes(),
                                               value.dtype == torch.bool))
            base.names.append(name)
    floor = input_precision(definition)
    recorder = WorkRecorder(bases, floor, real_indices)
    with torch.no_grad(), FunctionCounter(recorder, on_fake), recorder:
        result = reference.run(*inputs.values())
    for tensor in pytree.tree_leaves(result):  # an output that is a view of an input: a kernel reads what it copies
        if isinstance(tensor, torch.Tensor) and (base := bases.get(storage_key(tensor))) is not None:
            base.read(tensor)
    read_bytes = read_elements = bool_elements = 0
    for base in bases.values():
        footprint = base.footprint_bytes()
        read_bytes += footprint
        read_elements += footprint // base.itemsize
        bool_elements += footprint // base.itemsize if base.is_bool else 0
    write_elements = write_bytes = 0
    for spec in definition.outputs.values():
        numel = math.prod(definition.shape_of(spec, axes) or ())
        write_elements += numel
        write_bytes += numel * _itemsize(spec.dtype)
        bool_elements += numel if spec.dtype is DType.BOOL else 0
    unread = tuple(n for b in bases.values() if b.footprint_bytes() == 0 for n in b.names)
    return WorkCount(MappingProxyType(dict(recorder.matrix_flops)), recorder.vector_flops, read_bytes,
                     write_bytes, read_elements, write_elements, floor, solar_precision(definition),
                     counted_on, unread, bool_elements)


def _make_inputs(device: torch.device, definition: Definition, workload: Workload, axes: dict[str, int],
                 problem_root: Path | None, reference: ModuleType) -> dict[str, Any]:
    specs = workload.inputs
    if specs and all(isinstance(s, CustomInput) for s in specs.values()):
        entry = getattr(reference, definition.custom_inputs_entrypoint or "", None)
        if entry is None:
            raise SolCountError(f"custom inputs need {definition.custom_inputs_entrypoint!r} in the reference")
        with torch.random.fork_rng(devices=[]):  # leave the caller's random state alone
            torch.manual_seed(0)
            produced = entry(dict(axes), device)
        return {name: produced[name] for name in definition.inputs}
    generator = torch.Generator().manual_seed(0)
    values: dict[str, Any] = {}
    for name, tensor_spec in definition.inputs.items():
        spec = specs[name]
        if isinstance(spec, ScalarInput):
            values[name] = spec.value
        elif isinstance(spec, SafetensorsInput):
            from safetensors import safe_open

            with safe_open(str(_blob_path(spec, problem_root)), framework="pt") as handle:
                values[name] = handle.get_tensor(spec.tensor_key).to(device)
        else:
            shape = definition.shape_of(tensor_spec, axes) or ()
            dtype = SCHEMA_TORCH[tensor_spec.dtype]
            if device.type == "meta" or device is FAKE_CUDA:  # shapes only
                values[name] = torch.empty(shape, dtype=dtype, device=device)
            elif dtype.is_floating_point and dtype.itemsize > 1:
                values[name] = torch.randn(shape, generator=generator).to(dtype)
            elif dtype.itemsize == 1:  # bool masks, fp8 and packed fp4 data: all-zero bytes are valid
                values[name] = torch.zeros(shape, dtype=torch.uint8).view(dtype)
            else:  # indices: zeros are in range for any table
                values[name] = torch.zeros(shape, dtype=dtype)
    return values


def _blob_path(spec: SafetensorsInput, problem_root: Path | None) -> Path:
    path = Path(spec.path)
    return path if path.is_absolute() or problem_root is None else problem_root / path


def _itemsize(dtype: DType) -> int:
    return SCHEMA_TORCH[dtype].itemsize


def _input_bytes(definition: Definition, axes: dict[str, int]) -> int:
    return sum(math.prod(definition.shape_of(s, axes) or ()) * _itemsize(s.dtype)
               for s in definition.inputs.values() if s.shape is not None)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else ""

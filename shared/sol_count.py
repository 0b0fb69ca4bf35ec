"""Counting a workload's work for the SOL model (`shared.sol` prices it).

The reference runs under a dispatch mode, on meta tensors built from the workload's resolved
shapes (nothing is allocated, whatever the shapes), or on CPU with real tensors when it needs
values (`.item()`, data-dependent shapes) and its inputs fit the budget:
- matrix FLOPs: every op in torch's FLOP table (`torch.utils.flop_counter.flop_registry`, the
  formulas `FlopCounterMode` uses), priced later at the narrowest float dtype among the
  definition's inputs, the op's operands and any fp8/fp4 tensor made before it. Two calls are
  counted whole instead of as the ops they lower to: a two-operand einsum (broadcast repeats left
  out) and scaled_dot_product_attention (the causal half left out);
- vector FLOPs: one per output element of every other computing op (per input element for a
  reduction); views, copies, casts, gathers and factories count none;
- bytes: each input storage's footprint (the union of what the reference reads of it, each element
  once; a gather counts the rows it fetches), plus the definition's outputs written once.
"""

from __future__ import annotations

import math
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from shared.errors import KernelSwarmError
from shared.hardware import Precision
from shared.schema import CustomInput, Definition, SafetensorsInput, ScalarInput, Workload
from shared.schema.definition import DType, evaluate_sol_expression

DEFAULT_CPU_BUDGET_BYTES = 1 << 30
META, CPU = torch.device("meta"), torch.device("cpu")
FAKE_CUDA = torch.device("cuda")  # inside FakeTensorMode only: fake tensors on a device that need not exist
FAKE_CUDA_0 = torch.device("cuda", 0)


class SolCountError(KernelSwarmError):
    """The workload's work cannot be counted (missing data, a reference that runs nowhere)."""


# --- dtypes -------------------------------------------------------------------------------------

_NARROWNESS = {Precision.FP64: 5, Precision.FP32: 4, Precision.BF16: 3, Precision.FP16: 3,
               Precision.FP8: 2, Precision.FP4: 1}
_DTYPE_PRECISION: dict[torch.dtype, Precision] = {
    torch.float64: Precision.FP64, torch.float32: Precision.FP32, torch.bfloat16: Precision.BF16,
    torch.float16: Precision.FP16, torch.float8_e4m3fn: Precision.FP8, torch.float8_e5m2: Precision.FP8,
}
if hasattr(torch, "float4_e2m1fn_x2"):
    _DTYPE_PRECISION[torch.float4_e2m1fn_x2] = Precision.FP4
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


def narrowest(precisions: Iterable[Precision | None]) -> Precision | None:
    found = [p for p in precisions if p is not None]
    return min(found, key=lambda p: _NARROWNESS[p]) if found else None


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


_NO_FLOP_OPS = frozenset({
    "_to_copy", "copy_", "copy", "clone", "contiguous", "cat", "stack", "index", "index_select", "gather",
    "take", "embedding", "scatter", "index_put", "index_put_", "empty", "empty_like", "empty_strided",
    "new_empty", "new_empty_strided", "zeros", "zeros_like", "new_zeros", "ones", "ones_like", "new_ones",
    "full", "full_like", "new_full", "fill", "fill_", "zero_", "arange", "linspace", "scalar_tensor",
    "lift_fresh_copy", "repeat", "repeat_interleave", "constant_pad_nd", "flip", "roll", "_unsafe_view",
    "_local_scalar_dense", "slice_scatter", "select_scatter", "as_strided_scatter", "tril_indices",
    "triu_indices", "_pin_memory", "resize_", "set_", "detach_", "view_as_real", "view_as_complex",
    "split_with_sizes_copy", "unbind_copy", "masked_scatter", "masked_select", "nonzero", "sort",
    "argsort", "topk", "one_hot", "_reshape_copy", "expand_copy", "permute_copy", "t_copy",
})
_GATHER_OPS = frozenset({"embedding", "index_select", "index", "gather", "take", "_embedding_bag",
                         "embedding_bag"})


def _storage_key(tensor: torch.Tensor) -> int | None:
    try:
        return tensor.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return None


def _unique_numel(tensor: torch.Tensor) -> int:
    """Distinct elements a view reaches: broadcast (stride 0) dimensions count once."""
    return math.prod(s for s, st in zip(tensor.shape, tensor.stride()) if st != 0) if tensor.numel() else 0


@dataclass
class _Base:
    """One input storage and what the reference read of it."""

    names: list[str]
    itemsize: int
    nbytes: int
    is_bool: bool
    regions: set[tuple] = field(default_factory=set)  # (offset, sizes, strides, itemsize), in bytes
    spans: list[tuple[int, int]] = field(default_factory=list)
    gathered_bytes: int = 0

    def read(self, tensor: torch.Tensor) -> None:
        size = tensor.element_size()
        strides = tuple(st * size for st in tensor.stride())
        start = tensor.storage_offset() * size
        key = (start, tuple(tensor.shape), strides, size)
        if key in self.regions or tensor.numel() == 0:
            return
        self.regions.add(key)
        low = start + sum(min(0, (n - 1) * st) for n, st in zip(tensor.shape, strides))
        high = start + sum(max(0, (n - 1) * st) for n, st in zip(tensor.shape, strides)) + size
        self.spans.append((low, high))

    def footprint_bytes(self) -> int:
        """Each element once: the smaller of the union of the read spans and the sum of the
        distinct regions, plus what gathers fetched, capped at the storage size."""
        distinct = sum(math.prod(n for n, st in zip(r[1], r[2]) if st != 0) * r[3] for r in self.regions)
        union, end = 0, -1
        for low, high in sorted(self.spans):
            union += max(0, high - max(low, end))
            end = max(end, high)
        return min(self.nbytes, min(union, distinct) + self.gathered_bytes)


class _WorkRecorder(TorchDispatchMode):
    """Counts matrix and vector FLOPs and records which part of every input storage is read."""

    def __init__(self, bases: dict[int, _Base], floor: Precision, real_indices: bool = False) -> None:
        super().__init__()
        self.bases = bases
        self.floor = floor
        self.real_indices = real_indices  # index tensors hold the problem's own values (not our zeros)
        self.matrix_flops: dict[Precision, int] = defaultdict(int)
        self.vector_flops = 0
        self.seen_quant: Precision | None = None
        self.inside_counted_call = 0  # an einsum or causal attention counted whole, not its matmuls

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = _scaled_mm_stand_in(*args, **kwargs) if func is _SCALED_MM else func(*args, **kwargs)
        inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outputs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        for tensor in outputs:
            precision = _DTYPE_PRECISION.get(tensor.dtype)
            if precision in (Precision.FP8, Precision.FP4):
                self.seen_quant = narrowest((self.seen_quant, precision))
        if func.is_view or func.namespace == "prim":  # views; prim.device and the like compute nothing
            return out
        name = func.overloadpacket.__name__
        if func.overloadpacket in flop_registry:
            if not self.inside_counted_call:
                flops = int(flop_registry[func.overloadpacket](*args, **kwargs, out_val=out))
                if any(t.dtype == getattr(torch, "float4_e2m1fn_x2", None) for t in inputs[:2]):
                    flops *= 2  # two values per packed element along K
                self.add_matrix(flops, inputs)
        elif name not in _NO_FLOP_OPS:
            largest_input = max((t.numel() for t in inputs), default=0)
            self.vector_flops += max(sum(t.numel() for t in outputs), largest_input)
        self._record_reads(name, inputs, outputs, args)
        return out

    def add_matrix(self, flops: int, operands: list[torch.Tensor]) -> None:
        precision = narrowest(_DTYPE_PRECISION.get(t.dtype) for t in operands)
        self.matrix_flops[narrowest((precision, self.floor, self.seen_quant)) or Precision.FP32] += flops

    def _record_reads(self, name: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor], args: tuple) -> None:
        produced = {_storage_key(t) for t in outputs}
        for position, tensor in enumerate(inputs):
            key = _storage_key(tensor)
            base = self.bases.get(key)
            if base is None or key in produced:  # not an input, or an alias of it
                continue
            if name in _GATHER_OPS and position == 0:
                gathered = sum(t.numel() * t.element_size() for t in outputs)
                touched = _touched_bytes(name, args, tensor) if self.real_indices else None
                base.gathered_bytes += min(gathered if touched is None else touched,
                                           _unique_numel(tensor) * tensor.element_size())
            else:
                base.read(tensor)


def _touched_bytes(name: str, args: tuple, source: torch.Tensor) -> int | None:
    """The bytes of `source` a gather reads when its indices have values: the rows (elements, for
    `take`) of the distinct indices, each once; None where that is not known (values on meta or
    fake tensors, several index tensors, a mask)."""
    dim: int | None = 0
    if name == "embedding":
        index = args[1]
    elif name == "index_select":
        dim, index = args[1], args[2]
    elif name == "take":
        dim, index = None, args[1]
    elif name == "index" and args[1] and all(i is None for i in args[1][1:]):
        index = args[1][0]
    else:
        return None
    if not isinstance(index, torch.Tensor) or index.device.type != "cpu" or index.dtype == torch.bool:
        return None
    extent = source.numel() if dim is None else source.shape[dim]
    if extent == 0:
        return 0
    distinct = torch.unique(index.reshape(-1) % extent).numel()  # negative indices wrap, as torch's do
    row = 1 if dim is None else source.numel() // extent
    return distinct * row * source.element_size()


class _FunctionCounter(TorchFunctionMode):
    """Counts two calls whole, where the ops torch lowers them to would miscount:
    - a two-operand `torch.einsum`: 2 x the product of its index extents, leaving out indices along
      which every operand is broadcast (stride 0), whose results would only repeat (torch lowers
      it to a bmm over materialised copies and would count the repeats);
    - `F.scaled_dot_product_attention`: its two matmuls, over the kept (query, key) pairs only when
      `is_causal` (a causal kernel skips the masked half; the math lowering computes every pair,
      and the CPU kernel is not in torch's FLOP table at all).
    On fake CUDA tensors (`on_fake`), moves to "cuda" without an index name device 0: torch looks
    the current device up in a CUDA runtime there is none of."""

    def __init__(self, recorder: _WorkRecorder, on_fake: bool = False) -> None:
        super().__init__()
        self.recorder = recorder
        self.on_fake = on_fake

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.on_fake and func in (torch.Tensor.cuda, torch.Tensor.to):
            if func is torch.Tensor.cuda:
                return args[0].to(FAKE_CUDA_0)
            args, kwargs = _indexed_cuda((args, kwargs))
            return func(*args, **kwargs)
        if func is torch.functional.einsum and not kwargs:
            flops, operands = _einsum_flops(args)
        elif func is F.scaled_dot_product_attention:
            flops, operands = _attention_flops(args, kwargs)
        else:
            flops, operands = None, []
        if flops is None:
            return func(*args, **kwargs)
        self.recorder.inside_counted_call += 1
        try:
            out = func(*args, **kwargs)
        finally:
            self.recorder.inside_counted_call -= 1
        self.recorder.add_matrix(flops, operands)
        return out


def _indexed_cuda(tree: Any) -> Any:
    """`tree` with every "cuda" device (a string or a torch.device without index) as cuda:0."""
    def fix(leaf: Any) -> Any:
        if isinstance(leaf, str) and leaf == "cuda" or isinstance(leaf, torch.device) and leaf == FAKE_CUDA:
            return FAKE_CUDA_0
        return leaf
    return pytree.tree_map(fix, tree)


def _attention_flops(args: tuple, kwargs: dict) -> tuple[int | None, list[torch.Tensor]]:
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
    bound = dict(zip(names, args)) | kwargs
    query, key, value = bound.get("query"), bound.get("key"), bound.get("value")
    if not all(isinstance(t, torch.Tensor) for t in (query, key, value)):
        return None, []
    length, keys = query.shape[-2], key.shape[-2]
    if bound.get("is_causal") and bound.get("attn_mask") is None:
        kept = sum(min(i + 1, keys) for i in range(length))  # torch's causal mask: tril, top-left aligned
    else:
        kept = length * keys
    batch = math.prod(query.shape[:-2])
    return 2 * batch * kept * (query.shape[-1] + value.shape[-1]), [query, key, value]


def _einsum_flops(args: tuple) -> tuple[int | None, list[torch.Tensor]]:
    if not args or not isinstance(args[0], str):
        return None, []
    operands = list(args[1]) if len(args) == 2 and isinstance(args[1], (list, tuple)) else list(args[1:])
    equation = args[0].replace(" ", "")
    if "..." in equation or "->" not in equation or len(operands) != 2:
        return None, []
    terms = equation.split("->")[0].split(",")
    if len(terms) != 2 or not all(isinstance(t, torch.Tensor) and t.dim() == len(term)
                                  for t, term in zip(operands, terms)):
        return None, []
    extent: dict[str, int] = {}
    repeated: dict[str, bool] = {}
    for tensor, term in zip(operands, terms):
        for letter, size, stride in zip(term, tensor.shape, tensor.stride()):
            extent[letter] = max(extent.get(letter, 1), size)
            repeated[letter] = repeated.get(letter, True) and (stride == 0 or size == 1)
    return 2 * math.prod(n for letter, n in extent.items() if not (repeated[letter] and n > 1)), operands


_SCALED_MM = torch.ops.aten._scaled_mm.default


def _scaled_mm_stand_in(a: torch.Tensor, b: torch.Tensor, *args: Any, out_dtype: torch.dtype | None = None,
                        **kwargs: Any) -> torch.Tensor:
    """`_scaled_mm` has no CPU kernel for block-scaled fp8/fp4: counting only needs its output's
    shape and dtype, so the recorder returns an uninitialised one instead of running it."""
    if out_dtype is None and len(args) >= 5:
        out_dtype = args[4]
    return torch.empty((a.shape[0], b.shape[1]), dtype=out_dtype or a.dtype, device=a.device)


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
    bases: dict[int, _Base] = {}
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor) and (key := _storage_key(value)) is not None:
            base = bases.setdefault(key, _Base([], value.element_size(), value.untyped_storage().nbytes(),
                                               value.dtype == torch.bool))
            base.names.append(name)
    floor = input_precision(definition)
    recorder = _WorkRecorder(bases, floor, real_indices)
    with torch.no_grad(), _FunctionCounter(recorder, on_fake), recorder:
        result = reference.run(*inputs.values())
    for tensor in pytree.tree_leaves(result):  # an output that is a view of an input: a kernel reads what it copies
        if isinstance(tensor, torch.Tensor) and (base := bases.get(_storage_key(tensor))) is not None:
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

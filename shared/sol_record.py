"""The dispatch modes that count a reference's work for `shared.sol_count`.

`WorkRecorder` (a TorchDispatchMode) sees every aten op the reference runs: ops in torch's FLOP
table are matrix work at the narrowest precision of their operands (or of an fp8/fp4 tensor made
before them), other computing ops vector work; and it records which part of every input storage is
read (each element once; a gather by the rows it fetches, or by its distinct indices when they have
values). `FunctionCounter` (a TorchFunctionMode) counts a two-operand einsum and
scaled_dot_product_attention whole, and on fake CUDA tensors names device 0 for a bare "cuda".
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from shared.hardware import Precision

FAKE_CUDA = torch.device("cuda")  # inside FakeTensorMode only: fake tensors on a device that need not exist
FAKE_CUDA_0 = torch.device("cuda", 0)

_NARROWNESS = {Precision.FP64: 5, Precision.FP32: 4, Precision.BF16: 3, Precision.FP16: 3,
               Precision.FP8: 2, Precision.FP4: 1}
_DTYPE_PRECISION: dict[torch.dtype, Precision] = {
    torch.float64: Precision.FP64, torch.float32: Precision.FP32, torch.bfloat16: Precision.BF16,
    torch.float16: Precision.FP16, torch.float8_e4m3fn: Precision.FP8, torch.float8_e5m2: Precision.FP8,
}
if hasattr(torch, "float4_e2m1fn_x2"):
    _DTYPE_PRECISION[torch.float4_e2m1fn_x2] = Precision.FP4

def narrowest(precisions: Iterable[Precision | None]) -> Precision | None:
    found = [p for p in precisions if p is not None]
    return min(found, key=lambda p: _NARROWNESS[p]) if found else None



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


def storage_key(tensor: torch.Tensor) -> int | None:
    try:
        return tensor.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return None


def _unique_numel(tensor: torch.Tensor) -> int:
    """Distinct elements a view reaches: broadcast (stride 0) dimensions count once."""
    return math.prod(s for s, st in zip(tensor.shape, tensor.stride()) if st != 0) if tensor.numel() else 0


@dataclass
class InputStorage:
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


class WorkRecorder(TorchDispatchMode):
    """Counts matrix and vector FLOPs and records which part of every input storage is read."""

    def __init__(self, bases: dict[int, InputStorage], floor: Precision, real_indices: bool = False) -> None:
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
        produced = {storage_key(t) for t in outputs}
        for position, tensor in enumerate(inputs):
            key = storage_key(tensor)
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


class FunctionCounter(TorchFunctionMode):
    """Counts two calls whole, where the ops torch lowers them to would miscount:
    - a two-operand `torch.einsum`: 2 x the product of its index extents, leaving out indices along
      which every operand is broadcast (stride 0), whose results would only repeat (torch lowers
      it to a bmm over materialised copies and would count the repeats);
    - `F.scaled_dot_product_attention`: its two matmuls, over the kept (query, key) pairs only when
      `is_causal` (a causal kernel skips the masked half; the math lowering computes every pair,
      and the CPU kernel is not in torch's FLOP table at all).
    On fake CUDA tensors (`on_fake`), moves to "cuda" without an index name device 0: torch looks
    the current device up in a CUDA runtime there is none of."""

    def __init__(self, recorder: WorkRecorder, on_fake: bool = False) -> None:
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

"""Inputs for one workload: random by dtype, scalar, safetensors, or the definition's custom
entrypoint. Every set is drawn from its own seed, hashed from a secret only the trusted side knows.

A workload whose inputs are all random or scalar is `regenerable`: the candidate's process makes
each set again from the set's own seed instead of reading it from a file, and compares its
`digest` with the one the reference's process took of the same set.

Random floats are standard normal for every tensor, weights and biases included: an all-ones
norm weight would let a kernel that forgets the weight pass.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from shared.schema import CustomInput, Definition, RandomInput, SafetensorsInput, ScalarInput, Workload
from shared.schema.definition import DType

TORCH_DTYPES: dict[DType, torch.dtype] = {
    DType.FLOAT64: torch.float64,
    DType.FLOAT32: torch.float32,
    DType.FLOAT16: torch.float16,
    DType.BFLOAT16: torch.bfloat16,
    DType.FLOAT8_E4M3FN: torch.float8_e4m3fn,
    DType.FLOAT8_E5M2: torch.float8_e5m2,
    DType.INT64: torch.int64,
    DType.INT32: torch.int32,
    DType.INT16: torch.int16,
    DType.INT8: torch.int8,
    DType.BOOL: torch.bool,
}
if hasattr(torch, "float4_e2m1fn_x2"):
    TORCH_DTYPES[DType.FLOAT4_E2M1FN_X2] = torch.float4_e2m1fn_x2


NOT_REPRODUCED = "INPUTS_NOT_REPRODUCED"  # the candidate's report of a set it made differently
DIGEST_PERIOD = 1021  # a prime: the weighted sum below tells apart bytes whose positions differ mod it


class InputError(Exception):
    """The workload's inputs cannot be made (missing file, unknown dtype...): not the kernel's fault."""


def torch_dtype(dtype: DType) -> torch.dtype:
    try:
        return TORCH_DTYPES[dtype]
    except KeyError:
        raise InputError(f"dtype {dtype.value} is not supported by torch {torch.__version__}") from None


def random_tensor(shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator,
                  device: torch.device) -> torch.Tensor:
    """Drawn where `generator` lives (on the GPU for a GPU evaluation: a 128 MiB tensor takes
    milliseconds there, a fifth of a second on a CPU), then moved to `device`."""
    where = generator.device
    if dtype == getattr(torch, "float4_e2m1fn_x2", None):  # two packed FP4 values per byte
        drawn = torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8, device=where).view(dtype)
    elif dtype.is_floating_point:
        drawn = torch.randn(shape, generator=generator, dtype=torch.float32, device=where).to(dtype)
    elif dtype == torch.bool:
        drawn = torch.randint(0, 2, shape, generator=generator, device=where).bool()
    else:
        drawn = torch.randint(-64, 64, shape, generator=generator, dtype=dtype, device=where)
    return drawn.to(device)


def make_inputs(definition: Definition, workload: Workload, seed: int, device: torch.device,
                problem_root: Path | None, reference: ModuleType | None) -> dict[str, Any]:
    """One input set, keyed and ordered like `definition.inputs`."""
    axes = definition.resolve_axes(workload.axes)
    specs = workload.inputs
    if specs and all(isinstance(s, CustomInput) for s in specs.values()):
        return _custom_inputs(definition, workload, axes, seed, device, reference)
    generator = torch.Generator(device=device).manual_seed(seed)
    values: dict[str, Any] = {}
    for name, tensor_spec in definition.inputs.items():
        spec = specs[name]
        if isinstance(spec, ScalarInput):
            values[name] = spec.value
        elif isinstance(spec, SafetensorsInput):
            values[name] = _load_safetensors(spec, problem_root, device)
        elif isinstance(spec, RandomInput):
            shape = definition.shape_of(tensor_spec, axes)
            if shape is None:
                raise InputError(f"input `{name}` is a scalar (shape null) but its workload type is random")
            values[name] = random_tensor(shape, torch_dtype(tensor_spec.dtype), generator, device)
        else:
            raise InputError(f"input `{name}`: {spec.type} inputs cannot be mixed with others")
    return values


def _custom_inputs(definition: Definition, workload: Workload, axes: dict[str, int], seed: int,
                   device: torch.device, reference: ModuleType | None) -> dict[str, Any]:
    entry = definition.custom_inputs_entrypoint
    if reference is None or entry is None or not hasattr(reference, entry):
        raise InputError(f"custom inputs need the reference function {entry!r}")
    torch.manual_seed(seed)
    produced = getattr(reference, entry)(dict(axes), device)
    if not isinstance(produced, dict):
        raise InputError(f"{entry} returned {type(produced).__name__}, not a dict of inputs")
    missing = [n for n in definition.inputs if n not in produced]
    if missing:
        raise InputError(f"{entry} did not produce inputs {missing}")
    return {name: produced[name] for name in definition.inputs}


def _load_safetensors(spec: SafetensorsInput, problem_root: Path | None, device: torch.device) -> torch.Tensor:
    path = Path(spec.path)
    if not path.is_absolute() and problem_root is not None:
        path = problem_root / path
    if not path.exists():
        raise InputError(f"safetensors file not found: {path} (workload input needs key {spec.tensor_key!r})")
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        if spec.tensor_key not in handle.keys():
            raise InputError(f"{path} has no tensor {spec.tensor_key!r}")
        return handle.get_tensor(spec.tensor_key).to(device)


def regenerable(workload: Workload) -> bool:
    """Random and scalar inputs only: the same seed makes the same set in any process on the same
    device. Safetensors files may not be readable from the candidate's sandbox, and a custom
    generator need not be deterministic, so those sets travel as files."""
    return all(isinstance(spec, (RandomInput, ScalarInput)) for spec in workload.inputs.values())


def digest(values: dict[str, Any]) -> list[list[Any]]:
    """A cheap fingerprint of an input set, to tell whether two processes made the same one: per
    tensor its dtype, shape and two sums of its bits (`_sums`), per scalar its type and value. Not
    a cryptographic hash: it catches a generator that drew other values, not a forger."""
    found: list[list[Any]] = []
    for name, value in values.items():
        if isinstance(value, torch.Tensor):
            found.append([name, str(value.dtype).removeprefix("torch."), list(value.shape), *_sums(value)])
        else:
            found.append([name, type(value).__name__, repr(value)])
    return found


def _sums(tensor: torch.Tensor) -> list[int]:
    """The sum of the tensor's 64-bit words (and of its last bytes that make no word) and their sum
    weighted by position mod `DIGEST_PERIOD`, so that values in other places count too: one
    reduction over the tensor where it lives, one host sync. Integers, not values: exact whatever
    the reduction's order (the sums wrap mod 2**64), NaN payloads and FP8/FP4 included. Words,
    not bytes: a CPU sums int64 words ten times faster than bytes widened to int64."""
    raw = tensor.contiguous().view(-1).view(torch.uint8)
    if raw.storage_offset() % 8:  # a view into its storage that words cannot start at
        raw = raw.clone()
    whole = raw.numel() // 8 * 8
    words = raw[:whole].view(torch.int64)
    body = words.numel() - words.numel() % DIGEST_PERIOD
    columns = words[:body].view(-1, DIGEST_PERIOD).sum(dim=0)
    if body < words.numel():  # (skipped when empty: microseconds a small tensor on a CPU)
        columns[:words.numel() - body] += words[body:]
    if whole < raw.numel():
        columns[:raw.numel() - whole] += raw[whole:]
    weights = torch.arange(1, DIGEST_PERIOD + 1, dtype=torch.int64, device=raw.device)
    return torch.stack([columns.sum(), (columns * weights).sum()]).tolist()

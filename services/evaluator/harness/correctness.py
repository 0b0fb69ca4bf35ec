"""Compare a candidate's outputs with the reference's, under the workload's tolerance."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shared.schema import Status, Tolerance


@dataclass(frozen=True)
class Check:
    status: Status
    message: str = ""
    max_absolute_error: float = 0.0
    max_relative_error: float = 0.0
    matched_ratio: float = 1.0
    missing: int | None = None  # the input set whose outputs were not there when checked

    def as_dict(self) -> dict:
        return {"status": self.status.value, "message": self.message, "max_absolute_error": self.max_absolute_error,
                "max_relative_error": self.max_relative_error, "matched_ratio": self.matched_ratio,
                "missing": self.missing}

    @classmethod
    def from_dict(cls, data: dict) -> Check:
        return cls(Status(data["status"]), str(data.get("message", "")), float(data.get("max_absolute_error", 0.0)),
                   float(data.get("max_relative_error", 0.0)), float(data.get("matched_ratio", 1.0)),
                   data.get("missing"))


def compare(name: str, actual: object, expected: object, tolerance: Tolerance) -> Check:
    """One output tensor (or scalar): shape, then dtype, then values."""
    if not isinstance(expected, torch.Tensor):
        expected = torch.tensor(expected)
        actual = torch.tensor(actual) if not isinstance(actual, torch.Tensor) else actual
    if not isinstance(actual, torch.Tensor):
        kind = getattr(actual, "type_name", type(actual).__name__)
        return Check(Status.INCORRECT_SHAPE, f"output `{name}` is a {kind}, not a tensor")
    if tuple(actual.shape) != tuple(expected.shape):
        return Check(Status.INCORRECT_SHAPE,
                     f"output `{name}` has shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    if actual.dtype != expected.dtype:
        return Check(Status.INCORRECT_DTYPE, f"output `{name}` has dtype {actual.dtype}, expected {expected.dtype}")
    return _compare_values(name, actual, expected, tolerance)


ARITHMETIC = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def unmatchable(outputs: dict[str, object], tolerance: Tolerance) -> str | None:
    """Why the reference's own outputs fail `tolerance` against themselves, or None. Only NaN (and
    -inf unless the workload allows it) can make them: no output matches those elements, so where
    they exceed the unmatched share the tolerance leaves, no solution can pass on this input set."""
    for name, value in outputs.items():
        if not isinstance(value, torch.Tensor) or value.dtype not in ARITHMETIC or bool(torch.isfinite(value).all()):
            continue
        check = compare(name, value, value, tolerance)
        if check.status is not Status.PASSED:
            counts = {"NaN": value.isnan(), "-inf": value.isneginf(), "+inf": value.isposinf()}
            found = ", ".join(f"{int(mask.sum())} {label}" for label, mask in counts.items())
            return (f"output `{name}` holds {found} of {value.numel()} elements; they match {check.matched_ratio:.4%} "
                    f"of it against itself (need {tolerance.required_matched_ratio:.2%})")
    return None


CPU_CHUNK = 1 << 18  # elements: a chunk's float64 temporaries (2 MiB each) stay in the CPU's caches


def _compare_values(name: str, actual: torch.Tensor, expected: torch.Tensor, tolerance: Tolerance) -> Check:
    if actual.numel() == 0:
        return Check(Status.PASSED)
    flat_a, flat_e = _flat(actual), _flat(expected)
    n = flat_a.numel()
    # On the CPU a chunk at a time: the same elementwise test and the same reductions (an exact
    # count, maxima that keep a NaN), over cached chunks instead of a dozen passes through memory
    # of tensors 4x the outputs' size (the checker is the reference's process, under its bound).
    step = CPU_CHUNK if flat_a.device.type == "cpu" else n
    matched_count, abs_maxima, rel_maxima = 0, [], []
    for start in range(0, n, step):
        matched, abs_err, rel_err = _errors(_as_float(flat_a[start:start + step]),
                                            _as_float(flat_e[start:start + step]), tolerance)
        # A count, not a float32 mean: on the GPU that mean came out at 0.99999994 for tensors matched
        # everywhere, which failed workloads that need every element (SOL-ExecBench L1/065, H200).
        matched_count += int(matched.sum())
        abs_maxima.append(abs_err.max())
        rel_maxima.append(rel_err.max())
    ratio = matched_count / n
    max_abs, max_rel = torch.stack(abs_maxima).max().item(), torch.stack(rel_maxima).max().item()
    cap = tolerance.max_error_cap
    if ratio < tolerance.required_matched_ratio or (cap is not None and max_abs > cap):
        # The worst element: the first in the first chunk holding the largest error (argmax takes
        # NaN as the largest, over the chunks' maxima as over the whole), that chunk's errors again.
        start = int(torch.stack(abs_maxima).argmax()) * step
        a, e = _as_float(flat_a[start:start + step]), _as_float(flat_e[start:start + step])
        within = int(_errors(a, e, tolerance)[1].argmax())
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(start + within), actual.shape))
        message = (f"output `{name}`: {ratio:.4%} of elements within atol={tolerance.max_atol} "
                   f"rtol={tolerance.max_rtol} (need {tolerance.required_matched_ratio:.2%}); worst at "
                   f"{list(index)}: got {a[within].item():.6g}, expected {e[within].item():.6g}")
        return Check(Status.INCORRECT_NUMERICAL, message, max_abs, max_rel, ratio)
    return Check(Status.PASSED, "", max_abs, max_rel, ratio)


def _errors(a: torch.Tensor, e: torch.Tensor, tolerance: Tolerance) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per element of float64 `a` (got) and `e` (expected): matched, the absolute error (0 where
    both hold the same allowed infinity, inf where either is NaN) and the relative error."""
    abs_err = (a - e).abs()
    bound = tolerance.max_atol + tolerance.max_rtol * e.abs()
    matched = (abs_err <= bound) & torch.isfinite(e)  # rtol * inf would let anything match an infinity
    same_inf = torch.isinf(e) & (a == e)
    if not tolerance.allow_negative_inf:
        same_inf &= e > 0
    matched |= same_inf
    abs_err = torch.where(same_inf, torch.zeros_like(abs_err), abs_err)
    abs_err = torch.where(torch.isnan(a) | torch.isnan(e), torch.full_like(abs_err, float("inf")), abs_err)
    return matched, abs_err, abs_err / e.abs().clamp_min(1e-12)


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.detach()
    if tensor.dtype == getattr(torch, "float4_e2m1fn_x2", None):
        tensor = tensor.view(torch.uint8)
    return tensor.reshape(-1)


def _as_float(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to(torch.float64)

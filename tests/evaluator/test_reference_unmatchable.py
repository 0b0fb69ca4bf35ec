"""A reference whose own outputs fail the workload's tolerance against themselves (NaN, or -inf
where the workload does not allow it, beyond the unmatched share) makes the workload
INVALID_REFERENCE with the counts, not INCORRECT_NUMERICAL for every solution, itself included.
(SOL-ExecBench L2/043 draws A ~ N(0, 1) for a "negative log decay": exp(cumsum(A)) overflows on
about one input set in ten, and its reference then failed against itself.)"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from evalkit import FAST, affine_definition, make_problem, make_solution
from services.evaluator.harness.correctness import unmatchable
from services.evaluator.evaluate import evaluate
from shared.schema import Status, Tolerance

LOG_REFERENCE = "import torch\n\ndef run(x, w, b):\n    return torch.log(x) * w + b\n"  # NaN where x < 0


def tol(**fields: object) -> Tolerance:
    return Tolerance.model_validate({"max_atol": 1e-5, "max_rtol": 1e-5, **fields})


def test_finite_outputs_and_equal_positive_infinities_can_be_matched() -> None:
    x = torch.tensor([1.0, math.inf, -2.0])
    assert unmatchable({"y": x, "count": 3, "ids": torch.tensor([1, 2])}, tol()) is None


def test_nan_beyond_the_unmatched_share_cannot_be_matched() -> None:
    x = torch.tensor([1.0, math.nan, 2.0, 3.0], dtype=torch.bfloat16)
    message = unmatchable({"y": x}, tol())
    assert message is not None and "1 NaN, 0 -inf, 0 +inf of 4" in message and "75.0000%" in message
    assert unmatchable({"y": x}, tol(required_matched_ratio=0.75)) is None


def test_negative_infinity_counts_only_where_the_workload_allows_it() -> None:
    x = torch.tensor([-math.inf, 0.5])
    assert "1 -inf" in unmatchable({"lse": x}, tol())
    assert unmatchable({"lse": x}, tol(allow_negative_inf=True)) is None


def test_reference_with_nan_outputs_is_an_invalid_reference_not_a_wrong_solution(tmp_path: Path) -> None:
    definition = affine_definition("float32", name="log_affine", reference=LOG_REFERENCE)
    workloads = [{"uuid": "log-n64", "axes": {"n": 64}, "inputs": {n: {"type": "random"} for n in "xwb"},
                  "tolerance": {"max_atol": 1e-5, "max_rtol": 1e-5}}]
    problem = make_problem(tmp_path, definition, workloads)
    itself = make_solution(LOG_REFERENCE, "log_affine", dps=False)
    result = evaluate(problem, itself, FAST)
    assert result.status is Status.INVALID_REFERENCE, result.message
    assert "cannot be matched, not even by the reference" in result.message
    assert "NaN" in result.message


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.uint8])
def test_dtypes_without_arithmetic_are_left_to_the_comparison(dtype: torch.dtype) -> None:
    assert unmatchable({"q": torch.zeros(4, dtype=dtype)}, tol()) is None


FAILING_REFERENCE = "import torch\n\ndef run(x, w, b):\n    raise RuntimeError('CUBLAS_STATUS_NOT_SUPPORTED')\n"


@pytest.mark.parametrize("x_dtype", ["float4_e2m1fn_x2", "float32"])
def test_a_failing_nvfp4_reference_says_where_fp4_cannot_run(tmp_path: Path, x_dtype: str) -> None:
    """SOL-ExecBench's NVFP4 references call FP4 matmuls that need sm_100: on the H200 (and a CPU)
    they raise. INVALID_REFERENCE either way (no solution can be judged), and for an FP4 problem the
    message names the hardware first."""
    if x_dtype == "float4_e2m1fn_x2" and not hasattr(torch, "float4_e2m1fn_x2"):
        pytest.skip(f"torch {torch.__version__} has no FP4 dtype")
    definition = affine_definition("float32", name="fp4_affine", reference=FAILING_REFERENCE)
    definition["inputs"]["x"]["dtype"] = x_dtype
    workloads = [{"uuid": "fp4-n8", "axes": {"n": 8}, "inputs": {n: {"type": "random"} for n in "xwb"},
                  "tolerance": {"max_atol": 1e-5, "max_rtol": 1e-5}}]
    problem = make_problem(tmp_path, definition, workloads)
    result = evaluate(problem, make_solution(FAILING_REFERENCE, "fp4_affine", dps=False), FAST)
    assert result.status is Status.INVALID_REFERENCE, result.message
    assert "CUBLAS_STATUS_NOT_SUPPORTED" in result.message
    names_the_hardware = "needs an sm_100" in result.message and "the CPU" in result.message
    assert names_the_hardware is (x_dtype == "float4_e2m1fn_x2")

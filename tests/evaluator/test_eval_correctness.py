"""correctness.compare: shape, then dtype, then values under `|a - e| <= atol + rtol * |e|`, the
matched ratio and the max-error cap; infinities and NaN."""

from __future__ import annotations

import math

import pytest
import torch

from services.evaluator.harness.correctness import compare
from shared.schema import Status, Tolerance

EXACT = Tolerance(max_atol=0.0, max_rtol=0.0)


def tol(**fields: object) -> Tolerance:
    return Tolerance.model_validate({"max_atol": 0.0, "max_rtol": 0.0, **fields})


def test_identical_tensors_pass_with_zero_error() -> None:
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    check = compare("y", x.clone(), x, EXACT)
    assert check.status is Status.PASSED
    assert (check.max_absolute_error, check.max_relative_error, check.matched_ratio) == (0.0, 0.0, 1.0)
    assert check.message == ""


@pytest.mark.parametrize(("actual", "passes"), [
    (101.28125, True),   # exactly on the bound atol + rtol * |e| = 0.5 + 2**-7 * 100
    (98.71875, True),    # the bound holds both ways
    (101.28126, False),
    (98.7, False),
])
def test_bound_is_atol_plus_rtol_times_expected(actual: float, passes: bool) -> None:
    expected = torch.tensor([100.0], dtype=torch.float64)
    check = compare("y", torch.tensor([actual], dtype=torch.float64), expected, tol(max_atol=0.5, max_rtol=2**-7))
    assert (check.status is Status.PASSED) is passes
    assert check.max_absolute_error == pytest.approx(abs(actual - 100.0))
    assert check.max_relative_error == pytest.approx(abs(actual - 100.0) / 100.0)


def test_relative_tolerance_scales_with_the_expected_value_not_the_actual() -> None:
    # |0 - 1| = 1 <= 0 + 1.0 * |1|, but |1 - 0| = 1 > 0 + 1.0 * |0|.
    one, zero = torch.tensor([1.0]), torch.tensor([0.0])
    assert compare("y", zero, one, tol(max_rtol=1.0)).status is Status.PASSED
    assert compare("y", one, zero, tol(max_rtol=1.0)).status is Status.INCORRECT_NUMERICAL


def _three_off_in_a_hundred() -> tuple[torch.Tensor, torch.Tensor]:
    expected = torch.zeros(10, 10)
    actual = expected.clone()
    actual[2, 3], actual[5, 5], actual[9, 0] = 0.5, -2.0, 1.0
    return actual, expected


@pytest.mark.parametrize(("required", "status"), [
    (0.97, Status.PASSED), (0.96, Status.PASSED), (0.98, Status.INCORRECT_NUMERICAL), (1.0, Status.INCORRECT_NUMERICAL),
])
def test_matched_ratio(required: float, status: Status) -> None:
    actual, expected = _three_off_in_a_hundred()
    check = compare("y", actual, expected, tol(max_atol=0.1, required_matched_ratio=required))
    assert check.status is status
    assert check.matched_ratio == pytest.approx(0.97)
    assert check.max_absolute_error == 2.0  # reported even when the ratio lets it pass


def test_failure_message_names_output_ratio_and_worst_element() -> None:
    actual, expected = _three_off_in_a_hundred()
    check = compare("hidden", actual, expected, tol(max_atol=0.1, max_rtol=0.01))
    assert check.status is Status.INCORRECT_NUMERICAL
    assert check.message == ("output `hidden`: 97.0000% of elements within atol=0.1 rtol=0.01 (need 100.00%); "
                             "worst at [5, 5]: got -2, expected 0")


@pytest.mark.parametrize(("cap", "status"), [
    (None, Status.PASSED), (2.5, Status.PASSED), (1.5, Status.INCORRECT_NUMERICAL),
])
def test_max_error_cap_fails_a_single_large_error_the_ratio_allows(cap: float | None, status: Status) -> None:
    actual, expected = _three_off_in_a_hundred()
    check = compare("y", actual, expected, tol(max_atol=0.1, required_matched_ratio=0.9, max_error_cap=cap))
    assert check.status is status
    if status is not Status.PASSED:
        assert "worst at [5, 5]" in check.message


def test_same_positive_infinity_matches() -> None:
    expected = torch.tensor([1.0, math.inf])
    check = compare("y", expected.clone(), expected, EXACT)
    assert check.status is Status.PASSED
    assert check.max_absolute_error == 0.0


@pytest.mark.parametrize("allow", [False, True])
def test_negative_infinity_matches_only_when_allowed(allow: bool) -> None:
    expected = torch.tensor([1.0, -math.inf])
    check = compare("y", expected.clone(), expected, tol(allow_negative_inf=allow))
    assert check.status is (Status.PASSED if allow else Status.INCORRECT_NUMERICAL)


@pytest.mark.parametrize(("actual", "expected"), [
    ([1.0, 1e30], [1.0, math.inf]),       # finite where the reference is infinite
    ([1.0, math.inf], [1.0, 1e30]),       # infinite where the reference is finite
    ([1.0, -math.inf], [1.0, math.inf]),  # the wrong infinity
])
def test_infinity_mismatches_fail(actual: list[float], expected: list[float]) -> None:
    check = compare("y", torch.tensor(actual), torch.tensor(expected), tol(max_atol=1.0, max_rtol=1.0))
    assert check.status is Status.INCORRECT_NUMERICAL


def test_nan_output_fails_with_infinite_error() -> None:
    expected = torch.tensor([1.0, 2.0, 3.0])
    actual = torch.tensor([1.0, math.nan, 3.0])
    check = compare("y", actual, expected, tol(max_atol=10.0, max_rtol=10.0))
    assert check.status is Status.INCORRECT_NUMERICAL
    assert check.max_absolute_error == math.inf
    assert "worst at [1]: got nan, expected 2" in check.message


def test_nan_never_matches_not_even_nan() -> None:
    expected = torch.tensor([1.0, math.nan])
    check = compare("y", expected.clone(), expected, tol(max_atol=1.0))
    assert check.status is Status.INCORRECT_NUMERICAL
    assert check.matched_ratio == 0.5


def test_shape_is_checked_before_dtype() -> None:
    check = compare("y", torch.zeros(3, 4, dtype=torch.float64), torch.zeros(4, 3), EXACT)
    assert check.status is Status.INCORRECT_SHAPE
    assert check.message == "output `y` has shape (3, 4), expected (4, 3)"


def test_dtype_mismatch() -> None:
    check = compare("y", torch.zeros(2, dtype=torch.float16), torch.zeros(2, dtype=torch.bfloat16), EXACT)
    assert check.status is Status.INCORRECT_DTYPE
    assert check.message == "output `y` has dtype torch.float16, expected torch.bfloat16"


def test_missing_output_is_a_shape_error() -> None:
    check = compare("y", None, torch.zeros(2), EXACT)
    assert check.status is Status.INCORRECT_SHAPE
    assert "`y` is a NoneType, not a tensor" in check.message


def test_scalar_outputs_compare_as_values() -> None:
    assert compare("s", 2.0, 2.0, EXACT).status is Status.PASSED
    check = compare("s", 2.5, 2.0, tol(max_atol=0.1))
    assert check.status is Status.INCORRECT_NUMERICAL
    assert check.max_absolute_error == 0.5


def test_empty_tensors_pass() -> None:
    assert compare("y", torch.zeros(0, 4), torch.zeros(0, 4), EXACT).status is Status.PASSED


def test_low_precision_values_are_compared_in_float64() -> None:
    expected = torch.tensor([1.0, 256.0], dtype=torch.bfloat16)
    actual = torch.tensor([1.0078125, 258.0], dtype=torch.bfloat16)  # one bf16 ulp each
    check = compare("y", actual, expected, tol(max_rtol=2**-7))
    assert check.status is Status.PASSED
    assert check.max_absolute_error == 2.0
    assert check.max_relative_error == pytest.approx(2**-7)


def test_integers_compare_exactly() -> None:
    expected = torch.tensor([1, 2, 3], dtype=torch.int64)
    assert compare("i", expected.clone(), expected, EXACT).status is Status.PASSED
    check = compare("i", torch.tensor([1, 2, 4]), expected, EXACT)
    assert check.status is Status.INCORRECT_NUMERICAL
    assert "worst at [2]: got 4, expected 3" in check.message


def test_matched_ratio_is_an_exact_count() -> None:
    """One element off in 1,000,003 with exactly that share required passes. A float32 mean of the
    matches rounds 0.999999000003 down to 0.99999899 (and on the GPU rounded a full match below
    1.0), which failed workloads whose elements all matched."""
    n = 1_000_003
    expected = torch.zeros(n)
    actual = expected.clone()
    actual[0] = 1.0
    check = compare("y", actual, expected, tol(required_matched_ratio=(n - 1) / n))
    assert check.status is Status.PASSED, check.message
    assert check.matched_ratio == (n - 1) / n


def _specials(shape: tuple[int, ...], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A bf16 pair: noise around the expected values, and NaN and infinities strewn over both (some
    at the same places), across chunk boundaries."""
    g = torch.Generator().manual_seed(seed)
    expected = torch.randn(shape, generator=g, dtype=torch.float64)
    actual = expected + torch.randn(shape, generator=g, dtype=torch.float64) * 1e-2
    specials = torch.tensor([math.nan, math.inf, -math.inf, 0.0, 1e30], dtype=torch.float64)
    for tensor, count in ((expected, 40), (actual, 40)):
        where = torch.randint(0, tensor.numel(), (count,), generator=g)
        tensor.view(-1)[where] = specials[torch.randint(0, 5, (count,), generator=g)]
    both = torch.randint(0, expected.numel(), (20,), generator=g)
    actual.view(-1)[both] = expected.view(-1)[both] = specials[torch.randint(0, 5, (20,), generator=g)]
    return actual.to(torch.bfloat16), expected.to(torch.bfloat16)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("required", [1.0, 0.99])
@pytest.mark.parametrize("allow", [False, True])
def test_the_cpu_compares_a_chunk_at_a_time_with_the_same_verdict_figures_and_worst_element(
        monkeypatch: pytest.MonkeyPatch, seed: int, required: float, allow: bool) -> None:
    """The same figures as one pass over the whole tensor (CPU_CHUNK larger than it), the worst
    element included, for a tensor that spans several chunks (2.3 of the default size)."""
    from services.evaluator.harness import correctness

    actual, expected = _specials((600, 1000), seed)
    tolerance = tol(max_atol=0.01, max_rtol=0.01, required_matched_ratio=required, allow_negative_inf=allow)
    chunked = compare("y", actual, expected, tolerance)
    monkeypatch.setattr(correctness, "CPU_CHUNK", 1 << 30)
    whole = compare("y", actual, expected, tolerance)
    assert correctness.CPU_CHUNK > actual.numel() > 2 * (1 << 18)
    assert ((chunked.status, chunked.message, chunked.matched_ratio)
            == (whole.status, whole.message, whole.matched_ratio))
    for figure in ("max_absolute_error", "max_relative_error"):
        assert (math.isnan(getattr(chunked, figure)) and math.isnan(getattr(whole, figure))
                or getattr(chunked, figure) == getattr(whole, figure))


def test_a_single_wrong_element_in_a_later_chunk_is_counted_and_named() -> None:
    expected = torch.zeros(3 * (1 << 18), dtype=torch.float32)
    actual = expected.clone()
    actual[2 * (1 << 18) + 5] = 2.0
    check = compare("y", actual, expected, EXACT)
    assert check.status is Status.INCORRECT_NUMERICAL
    assert check.matched_ratio == (expected.numel() - 1) / expected.numel()
    assert check.max_absolute_error == 2.0
    assert f"worst at [{2 * (1 << 18) + 5}]: got 2, expected 0" in check.message

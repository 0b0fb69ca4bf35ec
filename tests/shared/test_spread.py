"""A speedup is said only where the solution's and the reference's intervals over their timed runs
(and over attempts, where one solution was evaluated in several) do not overlap; the CLI's table
shows each latency with its interval and fits 80 columns."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from kernelswarm.cli import _traces_table
from services.evaluator.harness.timing import Latency
from shared.schema import Status, Trace
from shared.spread import SAME, Spread, combine, latency_text, reference_text, speedup_text


def trace(latency: float, q1: float, q3: float, reference: float, rq1: float | None, rq3: float | None,
          charged: float | None = None) -> Trace:
    return Trace.model_validate({
        "definition": "p", "solution": "s",
        "workload": {"uuid": "w-1", "axes": {"n": 4096}, "inputs": {}},
        "evaluation": {
            "status": Status.PASSED.value, "environment": {"hardware": "cpu"}, "timestamp": "2026-12-07T00:00:00Z",
            "correctness": {"max_absolute_error": 0.0, "max_relative_error": 0.0},
            "performance": {"latency_ms": charged or latency, "reference_latency_ms": reference,
                            "speedup_factor": reference / (charged or latency)},
            "timing": {"median_ms": latency, "min_ms": q1 * 0.9, "max_ms": q3 * 1.1, "runs": 20, "q1_ms": q1,
                       "q3_ms": q3, "reference_q1_ms": rq1, "reference_q3_ms": rq3, "outer_charged_ms": charged}}})


def test_overlapping_intervals_are_about_one_times():
    assert speedup_text(trace(1.0, 0.9, 1.2, 1.1, 1.0, 1.3)) == SAME
    assert speedup_text(trace(1.0, 0.95, 1.05, 3.0, 2.9, 3.2)) == "3.00x"
    assert speedup_text(trace(3.0, 2.9, 3.2, 1.0, 0.95, 1.05)) == "0.33x"  # slower, and clearly so


def test_without_intervals_the_figure_is_shown_as_measured():
    assert speedup_text(trace(1.0, 0.9, 1.2, 1.1, None, None)) == "1.10x"
    assert latency_text(trace(1.0, 0.9, 1.2, 1.1, None, None)) == "1"


def test_a_charged_latency_has_no_interval_of_the_solutions_claim():
    charged = trace(1.0, 0.9, 1.1, 2.0, 1.9, 2.1, charged=1.95)  # the outer clock charged 1.95 ms a run
    assert latency_text(charged) == "1.95 [1.95–1.95]"
    assert speedup_text(charged) == SAME  # 1.95 lies inside the reference's [1.9, 2.1]


def test_attempts_combine_into_the_median_of_medians_and_the_union_of_intervals():
    parts = [Spread(0.50, 0.48, 0.52), Spread(0.55, 0.53, 0.60), Spread(0.52, 0.45, 0.54)]
    assert combine(parts) == Spread(0.52, 0.45, 0.60)
    assert combine(parts[:2]) == Spread(0.525, 0.48, 0.60)  # an even count: the middle two's mean
    assert combine(parts[:1]) == parts[0]
    with pytest.raises(ValueError):
        combine([])


def test_a_speedup_clear_in_each_attempt_may_be_inside_the_noise_over_them():
    mine = [Spread(0.80, 0.78, 0.82), Spread(0.86, 0.84, 0.89)]
    reference = [Spread(0.90, 0.88, 0.92), Spread(0.95, 0.93, 0.97)]
    assert not any(m.overlaps(r) for m, r in zip(mine, reference))
    assert combine(mine).overlaps(combine(reference))  # [0.78, 0.89] against [0.88, 0.97]


def test_latency_quartiles_come_from_the_runs():
    latency = Latency.of([4.0, 1.0, 2.0, 3.0, 5.0])
    assert (latency.median_ms, latency.q1_ms, latency.q3_ms, latency.min_ms, latency.max_ms) == (3.0, 2.0, 4.0, 1.0, 5.0)
    assert (Latency.of([2.5]).q1_ms, Latency.of([2.5]).q3_ms) == (2.5, 2.5)


class Result:
    status = Status.PASSED

    def __init__(self, traces):
        self.traces = traces


def test_the_eval_table_fits_80_columns_and_shows_intervals():
    out = io.StringIO()
    Console(file=out, width=80).print(_traces_table("llama31_8b_rmsnorm", "seed", Result([
        trace(0.0123, 0.0121, 0.0127, 0.0150, 0.0148, 0.0160), trace(1.0, 0.9, 1.2, 1.1, 1.0, 1.3)]), width=80))
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80
    text = out.getvalue()
    assert "PASSED" in text and "1.22x" in text and SAME in text and "axes" not in text
    assert "0.0123" in text and "[0.0121–0.0127]" in text and "[0.0148–0.016]" in text
    assert reference_text(trace(1.0, 0.9, 1.2, 1.1, 1.0, 1.3)) == "1.1 [1–1.3]"

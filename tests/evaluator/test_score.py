"""SOL scoring inside the evaluator, on the CPU with a hardware row given explicitly."""

from __future__ import annotations

import dataclasses

import pytest

from evalkit import FAST, affine_definition, affine_workloads, make_problem, make_solution
from services.evaluator import score
from services.evaluator.harness import timing
from services.evaluator.evaluate import evaluate
from shared.hardware import lookup
from shared.schema import Status
from shared.sol_bounded import Counted, UnknownReason

AFFINE = "import torch\n\ndef run(x, w, b, y):\n    y.copy_(x * w + b)\n"


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    return make_problem(tmp_path_factory.mktemp("score"), affine_definition(), affine_workloads())


def test_no_hardware_row_means_no_sol_block(problem):
    result = evaluate(problem, make_solution(AFFINE), FAST)
    assert result.status is Status.PASSED, result.message
    assert all(t.evaluation.sol is None for t in result.traces)
    assert result.sol_score is None


def test_passed_workloads_carry_t_sol_t_b_and_a_score(problem):
    config = dataclasses.replace(FAST, hardware=lookup("NVIDIA H200"))
    result = evaluate(problem, make_solution(AFFINE), config)
    assert result.status is Status.PASSED, result.message
    for trace in result.traces:
        sol = trace.evaluation.sol
        perf = trace.evaluation.performance
        assert sol.hardware == "H200 SXM" and sol.bound == "memory"
        assert 0 < sol.t_sol_ms < perf.latency_ms  # a CPU is far from an H200's limit
        assert sol.t_baseline_ms == pytest.approx(perf.reference_latency_ms)  # eager only: nothing compiled
        assert 0.0 <= sol.score <= 1.0
    assert result.sol_score == pytest.approx(sum(t.evaluation.sol.score for t in result.traces) / 2)


def test_a_time_below_the_physical_floor_is_a_reward_hack(problem):
    # A machine so slow that any real measurement here is impossibly fast for it.
    slow = dataclasses.replace(lookup("NVIDIA H200"), dram_gbps=1e-9)
    config = dataclasses.replace(FAST, hardware=slow)
    result = evaluate(problem, make_solution(AFFINE), config)
    assert result.status is Status.REWARD_HACK
    assert "below the physical floor" in result.message
    assert all(t.evaluation.performance is None for t in result.traces)


def test_the_counts_start_with_the_attempt_and_are_kept(problem, monkeypatch):
    """T_sol's counts run in the background from the attempt's start (not in its checks), once per
    (definition, workload) for the process; a failed count is kept and gives no SOL block."""
    counted = []
    real = score.count_workloads

    def counting(definition, workloads, root, **limits):
        counted.extend(w.uuid for w in workloads)
        return [Counted(c.uuid, None, UnknownReason.COUNT, "not countable") if c.uuid == problem.workloads[1].uuid
                else c for c in real(definition, workloads, root, **limits)]

    monkeypatch.setattr(score, "count_workloads", counting)
    monkeypatch.setattr(score, "_COUNTED", {})
    config = dataclasses.replace(FAST, hardware=lookup("NVIDIA H200"))
    progress = []
    result = evaluate(problem, make_solution(AFFINE), config,
                      progress=lambda message: progress.append((message, list(counted))))
    assert result.status is Status.PASSED, result.message
    checking = next(seen for message, seen in progress if message == "checking")
    assert checking[:1] == [problem.workloads[0].uuid]  # begun while the children ran, not in the checks
    assert [t.evaluation.sol is not None for t in result.traces] == [True, False]
    evaluate(problem, make_solution(AFFINE), config)
    assert sorted(counted) == sorted(w.uuid for w in problem.workloads)  # not again


def test_a_median_below_what_the_host_clock_can_time_is_a_reward_hack() -> None:
    shortest = timing.host_clock_floor_ms()
    assert 0.0 < shortest < 0.1  # an empty call between two readings: tens of nanoseconds to a microsecond
    frozen = score.below_the_host_clock("cpu", 1e-9)
    assert frozen is not None and "cannot be real" in frozen
    assert score.below_the_host_clock("cpu", 0.0) is not None
    assert score.below_the_host_clock("cpu", score.HOST_FLOOR_FRACTION * shortest) is None
    assert score.below_the_host_clock("cuda:0", 0.0) is None  # there: the SOL floor and CUPTI's clock


def test_the_least_an_honest_run_can_do_stays_above_the_host_clock_floor() -> None:
    """No false positive: the timing loop around a run that does nothing reads at least the floor."""
    import torch

    plan = timing.TimingPlan(warmup_runs=3, timing_runs=2000, budget_s=1.0)
    latency = timing.time_runs(lambda i: None, torch.device("cpu"), plan)
    assert latency.min_ms >= score.HOST_FLOOR_FRACTION * timing.host_clock_floor_ms(), latency
    assert score.below_the_host_clock("cpu", latency.median_ms) is None



def test_the_evaluator_service_counts_under_its_settings_limits(monkeypatch):
    """`tasks.register` applies the settings (`apply_settings`) before any task runs."""
    import inspect

    from services.evaluator import score, tasks
    from shared.settings import Settings
    from shared.sol_bounded import CountLimits

    monkeypatch.setattr(score, "COUNT_LIMITS", score.COUNT_LIMITS)  # put back afterwards
    settings = Settings(sol_count_memory_mb=3000, sol_count_time_s=7.5)
    tasks.apply_settings(settings)
    assert score.COUNT_LIMITS == CountLimits.from_settings(settings)
    assert (score.COUNT_LIMITS.memory_mb, score.COUNT_LIMITS.time_s) == (3000, 7.5)
    assert "apply_settings(runtime.settings)" in inspect.getsource(tasks.register)

"""The reference and the candidate are timed the same way (issue 28: the reference run as a solution
against itself read 0.24x on an idle CPU): the same number of timed runs, each on a fresh copy of
its input set, the outputs copied out after the run so that their memory is free for the next, the
guard's cheap check inside both sides' calls with its floor taken off the host's samples, and the
signal guard's system calls after the end reading. These tests check the mechanics; what the
self-comparison reads is measured in docs/results/first-hour.md, not asserted here."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from services.evaluator.evaluate import evaluate
from services.evaluator.harness import timing
from services.evaluator.harness.entry import empty_holding, hold
from services.evaluator.harness.guards import Guard, guard_floor_ms
from shared.schema import Definition, Status
from evalkit import FAST, affine_definition, affine_workloads, make_problem, make_solution


class _FakeClock:
    """perf_counter as the timing loop reads it: advanced only by the calls under test."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = _FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", fake)
    return fake


def test_work_after_the_end_reading_is_not_timed_and_the_overhead_is_taken_off(clock):
    order: list[str] = []

    def run(i: int) -> None:
        order.append(f"run {i}")
        clock.now += 0.003  # 3 ms of the call

    def after(i: int) -> None:
        order.append(f"after {i}")
        clock.now += 1.0  # the signal guard's system calls: outside the sample

    plan = timing.TimingPlan(warmup_runs=1, timing_runs=4, budget_s=float("inf"))
    latency = timing.time_runs(run, torch.device("cpu"), plan, host_overhead_ms=0.5, after=after)
    assert latency.runs == 4
    assert latency.min_ms == pytest.approx(2.5) and latency.max_ms == pytest.approx(2.5)
    assert order == ["run -1", "after -1", "run 0", "after 0", "run 1", "after 1", "run 2", "after 2",
                     "run 3", "after 3"]


def test_a_sample_never_goes_below_zero(clock):
    plan = timing.TimingPlan(warmup_runs=0, timing_runs=3, budget_s=float("inf"))
    latency = timing.time_runs(lambda i: None, torch.device("cpu"), plan, host_overhead_ms=1.0)
    assert latency.min_ms == 0.0


def test_begin_caps_the_timed_runs_at_the_sets_it_made():
    runs: list[int] = []
    plan = timing.TimingPlan(warmup_runs=2, timing_runs=20, budget_s=float("inf"))
    latency = timing.time_runs(lambda i: runs.append(i), torch.device("cpu"), plan, begin=lambda: 5)
    assert latency.runs == 5 and runs == [-2, -1, 0, 1, 2, 3, 4]
    capped = dataclasses.replace(plan, max_runs=3)  # the smaller cap wins
    assert timing.time_runs(lambda i: None, torch.device("cpu"), capped, begin=lambda: 5).runs == 3


def test_hold_copies_plain_tensors_into_the_buffers_made_before_the_run():
    definition = Definition.model_validate(affine_definition())
    holding = empty_holding(definition, {"n": 4, "d": 16}, torch.device("cpu"))
    assert torch.isnan(holding["y"]).all()
    returned = torch.arange(64, dtype=torch.float32).reshape(4, 16)
    held = hold({"y": returned}, holding)
    assert held["y"] is holding["y"] and torch.equal(held["y"], returned)
    returned.zero_()  # what the run's own memory holds later does not change what was held
    assert held["y"].sum() > 0
    wrong_shape = torch.ones(3, 16)
    assert hold({"y": wrong_shape}, holding)["y"] is wrong_shape  # left as returned: the check fails it

    class Sub(torch.Tensor):
        pass

    subclass = torch.ones(4, 16).as_subclass(Sub)
    assert hold({"y": subclass}, holding)["y"] is subclass  # never copied: copying could run its code


def test_the_guard_floor_is_what_the_check_costs_at_least():
    guard = Guard()
    floor = guard_floor_ms(guard.check_call)
    assert 0.0 <= floor < 1.0  # a few attribute reads: well under a millisecond
    assert guard.check_call() is None and guard.check_after_call() is None


def test_both_sides_time_the_same_number_of_runs_and_the_trace_says_what_was_taken_off(tmp_path):
    """The reference as a solution against itself: each side's timed runs are one per timed set,
    and the host samples had the guard's floor taken off (`Timing.guard_ms`)."""
    problem = make_problem(tmp_path, affine_definition(), affine_workloads())
    reference = make_solution("import torch\n\ndef run(x, w, b):\n    return x * w + b\n", dps=False)
    # Room for no more than the 4 sets of `timing_sets`: 4 timed runs of the 50 asked, on each side.
    config = dataclasses.replace(FAST, timing_runs=50, timing_sets=4, timing_budget_s=5.0, timed_bytes=1)
    result = evaluate(problem, reference, config)
    assert result.status is Status.PASSED, result.message
    for trace in result.traces:
        timing_ = trace.evaluation.timing
        assert timing_.runs == timing_.reference_runs == 4  # one per timed set, on each side
        assert timing_.guard_ms is not None and timing_.guard_ms > 0
        assert timing_.reference_q1_ms is not None

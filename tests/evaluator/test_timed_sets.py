"""Every timed run gets an input set of its own (values no earlier call saw), as many as the timed
runs while they fit under the memory cap, never fewer than `timing_sets`; the outputs of every
timed run are checked."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from evalkit import FAST, make_solution
from services.evaluator.harness.checks import timed_runs
from services.evaluator.evaluate import evaluate
from shared.schema import Problem, Status

# Logs a key of the input values of every call, in call order, per workload (by shape).
LOGS_INPUTS = """
import json
from pathlib import Path

CALLS = {}

def run(x, w, b, y):
    CALLS.setdefault(x.shape[0], []).append(repr((x.flatten()[:4].tolist(), w[:2].tolist())))
    Path("@LOG@").write_text(json.dumps(CALLS))
    y.copy_(x * w + b)
"""


def _logged_calls(affine: Problem, drop: Path, **config) -> tuple[list, dict[str, list[str]]]:
    log = drop / "calls.json"
    result = evaluate(affine, make_solution(LOGS_INPUTS.replace("@LOG@", str(log))),
                      dataclasses.replace(FAST, **config))
    assert result.status is Status.PASSED, result.message
    return result.traces, json.loads(log.read_text())


def test_no_timed_run_sees_values_an_earlier_call_saw(affine: Problem, drop: Path) -> None:
    traces, calls = _logged_calls(affine, drop, timing_runs=6, timing_budget_s=30.0)
    untimed = FAST.correctness_rounds + FAST.warmup_runs
    for trace, keys in zip(traces, calls.values()):
        assert trace.evaluation.timing.runs == 6
        assert len(keys) == untimed + 6
        timed = keys[untimed:]
        assert len(set(timed)) == len(timed) and not set(timed) & set(keys[:untimed])


def test_the_memory_cap_leaves_timing_sets_runs(affine: Problem, drop: Path) -> None:
    traces, calls = _logged_calls(affine, drop, timing_runs=6, timing_sets=2, timed_bytes=1,
                                  timing_budget_s=30.0)
    assert [t.evaluation.timing.runs for t in traces] == [2, 2]
    assert all(len(set(keys[-2:])) == 2 for keys in calls.values())


def test_a_run_count_its_sets_cannot_account_for_fails() -> None:
    assert timed_runs({"latency": {"runs": 3}}, 3) == 3
    assert [timed_runs({"latency": {"runs": r}}, 3) for r in (0, 4, 2.5, "3", None)] == [-1] * 5
    assert timed_runs({}, 3) == -1

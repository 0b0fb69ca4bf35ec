"""The outer clock re-times instead of accusing (`services/evaluator/retime.py`), end to end on the
CPU: a window over its allowance is timed again on fresh input sets whose outputs are checked too;
where no batch fits, the workload passes charged what the outer clock vouches for, never REWARD_HACK."""

from __future__ import annotations

import dataclasses

from evalkit import FAST, make_solution
from services.evaluator.evaluate import evaluate
from shared.schema import Problem, Status

# Honest, but its first timed call (calls 1-2: correctness rounds, 3: warm-up) takes 400 ms while
# the others take microseconds: its median explains none of that, so the first batch's window is
# over its allowance (about 100 ms here). A first call that pays for a cache or a lazy load does this.
SLOW_FIRST_TIMED_CALL = """
import time

CALLS = [0]

def run(x, w, b, y):
    CALLS[0] += 1
    if CALLS[0] == 4:
        time.sleep(0.4)
    y.copy_(x * w + b)
"""

HONEST = """
def run(x, w, b, y):
    y.copy_(x * w + b)
"""

# Right in the first timed batch of each workload only (calls 1-2: correctness, 3: warm-up, 4-6:
# the batch), zeros afterwards: a re-timed batch on fresh sets is checked like the first.
RIGHT_ONCE = """
CALLS = [0]

def run(x, w, b, y):
    CALLS[0] += 1
    if CALLS[0] <= 6:
        y.copy_(x * w + b)
    else:
        y.zero_()
"""


def test_a_batch_over_its_allowance_is_timed_again_and_passes(affine: Problem) -> None:
    result = evaluate(affine, make_solution(SLOW_FIRST_TIMED_CALL), FAST, max_workloads=1)
    assert result.status is Status.PASSED, result.message
    timing = result.traces[0].evaluation.timing
    assert timing.outer_retimes >= 1 and len(timing.load_avg) == 3, timing
    # Re-timed (once, where its second batch fits; on a machine loaded enough to push that one over
    # too, more or charged the cheaper batch's figure): the 400 ms of its first batch are not in its
    # latency either way.
    assert result.traces[0].evaluation.performance.latency_ms < 400 / 3


def test_a_batch_always_over_its_allowance_passes_charged_never_accused(affine: Problem) -> None:
    """The allowance shrunk below any window (a negative slack): every batch is over, on file-borne
    sets (`regenerate_inputs` off) as on seeds. The last re-time's outcome: PASSED, charged the
    outer clock's figure (at least the solution's own median), and flagged."""
    for regenerate in (False, True):
        config = dataclasses.replace(FAST, outer_clock_slack_ms=-1e6, outer_clock_retimes=2,
                                     regenerate_inputs=regenerate)
        result = evaluate(affine, make_solution(HONEST), config)
        assert result.status is Status.PASSED, result.message
        for trace in result.traces:
            timing, performance = trace.evaluation.timing, trace.evaluation.performance
            assert timing.outer_retimes == 2 and timing.outer_charged_ms is not None, timing
            assert performance.latency_ms == timing.outer_charged_ms >= timing.median_ms
            assert "charged" in trace.evaluation.log and "3 tries" in trace.evaluation.log


def test_every_re_timed_batch_is_checked(affine: Problem) -> None:
    config = dataclasses.replace(FAST, outer_clock_slack_ms=-1e6, outer_clock_retimes=1)
    result = evaluate(affine, make_solution(RIGHT_ONCE), config, max_workloads=1)
    assert result.status is Status.INCORRECT_NUMERICAL, result.message
    assert "timed run on input set 5" in result.message  # the re-timed batch's first set (2 rounds + 3)


def test_without_re_times_a_batch_over_its_allowance_is_charged(affine: Problem) -> None:
    config = dataclasses.replace(FAST, outer_clock_retimes=0)
    result = evaluate(affine, make_solution(SLOW_FIRST_TIMED_CALL), config, max_workloads=1)
    assert result.status is Status.PASSED, result.message
    timing = result.traces[0].evaluation.timing
    assert timing.outer_retimes == 0 and timing.outer_charged_ms is not None
    # The 400 ms it spent in its 3 runs is in what it is charged per run, not its median of
    # microseconds: less the reference's overhead per set that `charged_ms` takes off the window,
    # a few ms under load (132.97 ms per run was seen in CI with the compose stack beside it).
    assert result.traces[0].evaluation.performance.latency_ms >= 0.9 * 400 / 3 > timing.median_ms

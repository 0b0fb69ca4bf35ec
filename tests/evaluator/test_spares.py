"""Children started ahead of their attempts, and the per-workload timeout."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from services.evaluator.evaluate import evaluate
from services.evaluator.spares import Spares, reference_ids, spare_homes
from shared.schema import Status
from evalkit import FAST, affine_definition, affine_workloads, make_problem, make_solution

GOOD = """
import torch

def run(x, w, b, y):
    torch.addcmul(b, x, w, out=y)
"""

# Hangs on the second workload only (n = 7 rows).
HANGS_ON_SECOND = """
import time
import torch

def run(x, w, b, y):
    if x.shape[0] == 7:
        time.sleep(3600)
    torch.addcmul(b, x, w, out=y)
"""


@pytest.fixture
def problem():
    """Outside /tmp and readable by others: where a spare reference, started before its problem
    was known, can read it (a problem in /tmp gets a reference started for it: `spares.spare_sees`)."""
    folder = Path(tempfile.mkdtemp(prefix="ks-spares-", dir="/var/tmp"))
    folder.chmod(0o755)
    yield make_problem(folder, affine_definition(), affine_workloads())
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def spares(tmp_path):
    pool = Spares("cpu", str(tmp_path))
    yield pool
    pool.close()


def _waiting(pool: Spares) -> dict[str, int]:
    return {role: spare.child.process.pid for role, spare in pool._ready.items() if spare.child.alive()}


def test_attempts_use_spares_once_and_leave_new_ones_waiting(problem, spares):
    config = dataclasses.replace(FAST, spares=spares)
    spares.refill({"reference": "ref", "candidate": "cand"})
    first = _waiting(spares)
    assert set(first) == {"reference", "candidate"}
    result = evaluate(problem, make_solution(GOOD), config)
    assert result.status is Status.PASSED, result.message
    second = _waiting(spares)
    assert set(second) == {"reference", "candidate"}
    assert not set(first.values()) & set(second.values()), "a spare was used twice"
    for pid in first.values():  # the used children are gone, their folders too
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert evaluate(problem, make_solution(GOOD), config).status is Status.PASSED


def test_a_spare_that_died_while_waiting_is_replaced(problem, spares):
    config = dataclasses.replace(FAST, spares=spares)
    spares.refill({"reference": "ref", "candidate": "cand"})
    for spare in spares._ready.values():
        spare.child.kill()
    result = evaluate(problem, make_solution(GOOD), config)
    assert result.status is Status.PASSED, result.message


def test_close_stops_the_waiting_spares(spares):
    spares.refill({"reference": "ref", "candidate": "cand"})
    pids = list(_waiting(spares).values())
    roots = [s.root for s in spares._ready.values()]
    spares.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not any(root.exists() for root in roots)


def test_a_workload_that_hangs_is_cut_off_by_the_workload_timeout(problem):
    config = dataclasses.replace(FAST, attempt_timeout_s=600.0, workload_timeout_s=4.0)
    result = evaluate(problem, make_solution(HANGS_ON_SECOND), config)
    statuses = [t.evaluation.status for t in result.traces]
    assert statuses == [Status.PASSED, Status.TIMEOUT], result.message
    assert "more than 4 s on one workload" in result.traces[1].evaluation.log


def test_the_candidate_starts_only_after_its_folders_are_handed_over(problem, monkeypatch):
    """Where the candidate runs as another user, a child forked at once used to enter its home
    while that was still the evaluator's (0700) and die on `chdir` whenever the hand-over lost the
    race (seen on the H200). The hand-over must come first, whoever the candidate runs as."""
    from services.evaluator import children
    from services.evaluator import evaluate as evaluate_module

    events: list[str] = []
    hand_over, start_child = children.hand_over_folders, evaluate_module.start_child

    def recorded_hand_over(*args):
        events.append("hand over")
        hand_over(*args)

    def recorded_start(*args, **kwargs):
        events.append("start candidate" if kwargs.get("ids") == "candidate" else "start reference")
        return start_child(*args, **kwargs)

    monkeypatch.setattr(children, "hand_over_folders", recorded_hand_over)
    monkeypatch.setattr(evaluate_module, "start_child", recorded_start)
    result = evaluate(problem, make_solution(GOOD), dataclasses.replace(FAST, spares=None))
    assert result.status is Status.PASSED, result.message
    assert events == ["start reference", "hand over", "start candidate"]


def test_a_one_shot_pool_serves_one_attempt_and_starts_nothing_more(problem, tmp_path):
    """`kernelswarm eval`'s pool (`replace=False`): both children started together ahead of the
    attempt, taken by it, and none started in their place."""
    pool = Spares("cpu", str(tmp_path), replace=False)
    try:
        pool.start_ahead(spare_homes(problem.root, False, reference_ids(problem.root)))
        pool._started()  # the starting thread done, to read what it started
        started = _waiting(pool)
        assert set(started) == {"reference", "candidate"}
        result = evaluate(problem, make_solution(GOOD), dataclasses.replace(FAST, spares=pool))
        assert result.status is Status.PASSED, result.message
        assert _waiting(pool) == {} and pool._ready == {}
        for pid in started.values():
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        pool.close()


def test_spare_homes_leave_out_a_reference_that_cannot_see_its_problem():
    inside_tmp = Path(tempfile.mkdtemp(prefix="ks-spares-"))
    try:
        assert set(spare_homes(inside_tmp, False, reference_ids(inside_tmp))) == {"candidate"}
        assert set(spare_homes(inside_tmp, True, reference_ids(inside_tmp))) == {"candidate", "timer"}
        assert set(spare_homes(None, False, reference_ids(None))) == {"reference", "candidate"}
    finally:
        shutil.rmtree(inside_tmp, ignore_errors=True)


def test_an_attempt_takes_spares_still_starting_and_close_waits_for_them(problem, tmp_path):
    """`take` waits for `start_ahead`'s thread: an attempt begun at once gets the spares it started
    (none started twice); `close` right after `start_ahead` stops what the thread started."""
    pool = Spares("cpu", str(tmp_path), replace=False)
    try:
        pool.start_ahead(spare_homes(problem.root, False, reference_ids(problem.root)))
        result = evaluate(problem, make_solution(GOOD), dataclasses.replace(FAST, spares=pool))
        assert result.status is Status.PASSED, result.message
        assert pool._ready == {} and pool._starting is None
    finally:
        pool.close()
    other = Spares("cpu", str(tmp_path), replace=False)
    other.start_ahead(spare_homes(problem.root, False, reference_ids(problem.root)))
    other.close()
    assert other._ready == {} and not [p for p in tmp_path.iterdir() if p.name.startswith("ks-")]

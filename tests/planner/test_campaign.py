"""Campaigns: round-robin assignment over idle writer slots, stopping, and the best attempt per problem.

The writer closes an assignment itself (`finish` here) before it reports it done."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from plannerkit import T0, Attempts, WriteQueue, active, best_of
from services.planner.campaign import (
    Budgets, assignment_done, create_campaign, list_campaigns, pause_campaign, resume_campaign, stop_campaign,
)
from services.planner.best import update_best
from services.planner.tick import tick
from shared.db import AssignmentRow, CampaignRow, Database
from shared.errors import NotFoundError, UserError

def campaign(db: Database, problem_ids: list[int], writers: int = 2, device: str = "cpu") -> int:
    return create_campaign(db, "c", problem_ids, device=device, writers=writers, attempts_per_assignment=3,
                           policy="round_robin")


def finish(db: Database, assignment_id: int, queue: WriteQueue) -> list[int]:
    """What a writer does: make an attempt (one that fails, so it is never a best), close the
    assignment, then report it done. (A DONE assignment without attempts means "nothing left to
    try", which retires the problem.)"""
    with db.session() as session:
        row = session.get(AssignmentRow, assignment_id)
        problem_id, campaign_id = row.problem_id, row.campaign_id
    Attempts(db).add(problem_id, campaign_id, "COMPILE_ERROR", assignment_id=assignment_id)
    with db.session() as session:
        row = session.get(AssignmentRow, assignment_id)
        if row.status in ("QUEUED", "RUNNING"):
            row.status, row.finished_at = "DONE", T0
    return assignment_done(db, assignment_id, queue)


def test_a_tick_fills_every_writer_slot_in_campaign_order(db, problem_ids, queue):
    order = [problem_ids[2], problem_ids[0], problem_ids[1]]  # the campaign's order, not the ids'
    campaign_id = campaign(db, order, writers=2)

    created = tick(db, campaign_id, queue)

    assert created == queue.sent and len(created) == 2
    assert queue.problems == order[:2]
    with db.session() as session:
        rows = [session.get(AssignmentRow, i) for i in created]
        assert {(r.campaign_id, r.budget_attempts, r.status) for r in rows} == {(campaign_id, 3, "QUEUED")}


def test_round_robin_continues_across_ticks(db, problem_ids, queue):
    campaign_id = campaign(db, problem_ids, writers=2)
    tick(db, campaign_id, queue)
    for _ in range(5):  # each finished assignment frees one slot, which goes to the next problem
        finish(db, queue.sent[-2], queue)

    assert len(queue.sent) == 7
    assert queue.problems == [problem_ids[i % 3] for i in range(7)]


def test_more_writers_than_problems_wraps_around(db, problem_ids, queue):
    campaign_id = campaign(db, problem_ids[:2], writers=5)
    tick(db, campaign_id, queue)
    assert queue.problems == [problem_ids[0], problem_ids[1]] * 2 + [problem_ids[0]]


def test_never_more_active_assignments_than_writers(db, problem_ids, queue):
    campaign_id = campaign(db, problem_ids, writers=3)
    assert len(tick(db, campaign_id, queue)) == 3
    assert tick(db, campaign_id, queue) == []
    with db.session() as session:  # a running assignment still holds its slot
        session.get(AssignmentRow, queue.sent[0]).status = "RUNNING"
    assert tick(db, campaign_id, queue) == []
    assert active(db, campaign_id) == 3

    assert len(finish(db, queue.sent[1], queue)) == 1
    assert tick(db, campaign_id, queue) == []
    assert active(db, campaign_id) == 3 and len(queue.sent) == 4


def test_campaigns_do_not_share_slots(db, problem_ids, queue):
    first, second = campaign(db, problem_ids, writers=1), campaign(db, problem_ids, writers=2)
    assert len(tick(db, first, queue)) == 1
    assert len(tick(db, second, queue)) == 2
    assert (active(db, first), active(db, second)) == (1, 2)


def test_no_ticks_after_stop(db, problem_ids, queue):
    campaign_id = campaign(db, problem_ids, writers=2)
    tick(db, campaign_id, queue)
    stop_campaign(db, campaign_id)

    assert tick(db, campaign_id, queue) == []
    assert finish(db, queue.sent[0], queue) == []
    assert len(queue.sent) == 2
    with db.session() as session:
        row = session.get(CampaignRow, campaign_id)
        assert row.status == "STOPPED" and row.stopped_at is not None
        stopped_at = row.stopped_at

    stop_campaign(db, campaign_id)  # stopping twice keeps the first time
    with db.session() as session:
        assert session.get(CampaignRow, campaign_id).stopped_at == stopped_at


def test_assignment_done_fills_the_freed_slot_once(db, problem_ids, queue):
    campaign_id = campaign(db, problem_ids, writers=1)
    (first,) = tick(db, campaign_id, queue)

    (second,) = finish(db, first, queue)

    assert queue.sent == [first, second]
    assert assignment_done(db, first, queue) == []  # delivered twice: nothing changes, no extra slot
    with db.session() as session:
        assert session.get(AssignmentRow, first).finished_at == T0


def test_a_done_report_for_a_running_assignment_does_not_close_it(db, problem_ids, queue):
    """Only the writer closes an assignment: a stray report must not free its slot."""
    campaign_id = campaign(db, problem_ids, writers=1)
    (first,) = tick(db, campaign_id, queue)
    with db.session() as session:
        session.get(AssignmentRow, first).status = "RUNNING"

    assert assignment_done(db, first, queue) == []
    assert active(db, campaign_id) == 1


def test_the_best_attempt_is_passed_then_fastest_then_lowest_latency_then_earliest(db, problem_ids, queue):
    problem, other = problem_ids[0], problem_ids[1]
    campaign_id = campaign(db, [problem, other], writers=1)
    elsewhere = campaign(db, [problem], writers=1)
    (assignment_id,) = tick(db, campaign_id, queue)
    attempts = Attempts(db)
    attempts.add(problem, campaign_id, "INCORRECT_NUMERICAL", speedup=50.0, latency_ms=0.1, minute=0)
    attempts.add(problem, campaign_id, "REWARD_HACK", speedup=80.0, latency_ms=0.1, minute=0)
    attempts.add(problem, campaign_id, "PENDING", minute=0)
    attempts.add(problem, campaign_id, "PASSED", speedup=None, latency_ms=0.1, minute=0)
    attempts.add(problem, elsewhere, "PASSED", speedup=9.0, latency_ms=0.1, minute=0)  # another campaign
    attempts.add(problem, None, "PASSED", speedup=9.0, latency_ms=0.1, minute=0)  # no campaign at all
    attempts.add(other, campaign_id, "PASSED", speedup=9.0, latency_ms=0.1, minute=0)  # another problem
    attempts.add(problem, campaign_id, "PASSED", speedup=1.5, latency_ms=1.0, minute=1)
    attempts.add(problem, campaign_id, "PASSED", speedup=2.0, latency_ms=5.0, minute=2)
    attempts.add(problem, campaign_id, "PASSED", speedup=2.0, latency_ms=4.0, minute=9)  # ties, later
    early = attempts.add(problem, campaign_id, "PASSED", speedup=2.0, latency_ms=4.0, minute=3)

    finish(db, assignment_id, queue)

    assert best_of(db, campaign_id, problem) == early
    assert best_of(db, campaign_id, other) is None  # only the finished assignment's problem is updated


def test_failed_attempts_are_never_best(db, problem_ids, queue):
    campaign_id = campaign(db, problem_ids[:1], writers=1)
    (assignment_id,) = tick(db, campaign_id, queue)
    attempts = Attempts(db)
    for status in ("COMPILE_ERROR", "RUNTIME_ERROR", "TIMEOUT", "INCORRECT_SHAPE", "REWARD_HACK"):
        attempts.add(problem_ids[0], campaign_id, status, speedup=3.0, latency_ms=1.0)

    finish(db, assignment_id, queue)

    assert best_of(db, campaign_id, problem_ids[0]) is None


def test_an_unknown_latency_does_not_win_a_tie(db, problem_ids, queue):
    campaign_id = campaign(db, problem_ids[:1], writers=1)
    (assignment_id,) = tick(db, campaign_id, queue)
    attempts = Attempts(db)
    attempts.add(problem_ids[0], campaign_id, "PASSED", speedup=2.0, latency_ms=None, minute=0)
    measured = attempts.add(problem_ids[0], campaign_id, "PASSED", speedup=2.0, latency_ms=4.0, minute=1)

    finish(db, assignment_id, queue)

    assert best_of(db, campaign_id, problem_ids[0]) == measured


def test_the_best_moves_when_a_later_assignment_finds_a_faster_attempt(db, problem_ids, queue):
    problem = problem_ids[0]
    campaign_id = campaign(db, [problem], writers=1)
    (first,) = tick(db, campaign_id, queue)
    attempts = Attempts(db)
    slow = attempts.add(problem, campaign_id, "PASSED", speedup=1.2, latency_ms=3.0, minute=0)
    (second,) = finish(db, first, queue)
    assert best_of(db, campaign_id, problem) == slow

    fast = attempts.add(problem, campaign_id, "PASSED", speedup=1.8, latency_ms=2.0, minute=5)
    finish(db, second, queue)
    assert best_of(db, campaign_id, problem) == fast


def test_unknown_ids_raise_not_found(db, problem_ids, queue):
    with pytest.raises(NotFoundError):
        tick(db, 404, queue)
    with pytest.raises(NotFoundError):
        stop_campaign(db, 404)
    with pytest.raises(NotFoundError):
        assignment_done(db, 404, queue)
    assert queue.sent == []


def test_a_campaign_without_problems_is_a_user_error(db):
    with pytest.raises(UserError):
        create_campaign(db, "empty", [], device="cpu", writers=2, attempts_per_assignment=3)
    with db.session() as session:
        assert session.scalar(select(func.count()).select_from(CampaignRow)) == 0


# --- validation, controls and listing --------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"problem_ids": [404]}, "no problem with id 404"),
    ({"problem_ids": "dup"}, "problem ids given twice"),
    ({"writers": 0}, "writers must be at least 1"),
    ({"attempts_per_assignment": 0}, "attempts per assignment must be at least 1"),
    ({"policy": "oracle"}, "unknown policy 'oracle'"),
    ({"name": " "}, "a campaign needs a name"),
    ({"budgets": Budgets(attempts=0)}, "the attempts budget must be positive"),
    ({"budgets": Budgets(gpu_s=-1.0)}, "the GPU-seconds budget must be positive"),
], ids=["unknown-problem", "duplicate", "writers", "per-assignment", "policy", "name", "attempts", "gpu"])
def test_create_campaign_validates_its_inputs(db, problem_ids, kwargs, message):
    arguments = {"name": "c", "problem_ids": problem_ids, "device": "cpu", "writers": 2,
                 "attempts_per_assignment": 3, **kwargs}
    if arguments["problem_ids"] == "dup":
        arguments["problem_ids"] = [problem_ids[0], problem_ids[1], problem_ids[0]]
    with pytest.raises(UserError, match=message):
        create_campaign(db, **arguments)
    with db.session() as session:
        assert session.scalar(select(func.count()).select_from(CampaignRow)) == 0


def test_a_new_campaign_uses_the_default_policy_and_keeps_its_budgets(db, problem_ids):
    campaign_id = create_campaign(db, "c", problem_ids, "cpu", 2, 3, budgets=Budgets(10, 5.0, 1000, 60.0))
    (summary,) = list_campaigns(db)
    assert (summary.id, summary.policy, summary.status, summary.problems) == (campaign_id, "headroom_ucb", "RUNNING", 3)
    assert summary.budgets == Budgets(10, 5.0, 1000, 60.0)


def test_pause_resume_and_stop(db, problem_ids, queue):
    campaign_id = campaign(db, problem_ids)
    assert pause_campaign(db, campaign_id) == "PAUSED"
    assert tick(db, campaign_id, queue) == []
    assert resume_campaign(db, campaign_id) == "RUNNING"
    assert len(tick(db, campaign_id, queue)) == 2
    assert stop_campaign(db, campaign_id) == "STOPPED"
    with pytest.raises(UserError, match="stopped; create a new one"):
        resume_campaign(db, campaign_id)
    with pytest.raises(UserError, match="cannot be paused"):
        pause_campaign(db, campaign_id)
    with pytest.raises(NotFoundError):
        pause_campaign(db, 404)


def test_list_counts_attempts_costs_and_active_assignments(db, problem_ids, queue):
    first = campaign(db, problem_ids, writers=2)
    second = campaign(db, problem_ids[:1], writers=1)
    tick(db, first, queue)
    attempts = Attempts(db)
    attempts.add(problem_ids[0], first, "PASSED", speedup=1.0, gpu_seconds=1.5, tokens=100)
    attempts.add(problem_ids[1], first, "PENDING", tokens=20)

    summaries = {s.id: s for s in list_campaigns(db)}
    assert (summaries[first].attempts, summaries[first].gpu_s, summaries[first].tokens) == (2, 1.5, 120)
    assert summaries[first].active_assignments == 2
    assert (summaries[second].attempts, summaries[second].active_assignments) == (0, 0)


def test_update_best_ignores_a_problem_outside_the_campaign(db, problem_ids):
    campaign_id = campaign(db, problem_ids[:1])
    Attempts(db).add(problem_ids[1], campaign_id, "PASSED", speedup=2.0)
    with db.session() as session:
        assert update_best(session, campaign_id, problem_ids[1]) is None


def test_a_measured_sol_score_ranks_before_speedup(db, problem_ids, queue):
    campaign_id = campaign(db, problem_ids[:1], writers=1)
    (assignment_id,) = tick(db, campaign_id, queue)
    attempts = Attempts(db)
    attempts.add(problem_ids[0], campaign_id, "PASSED", speedup=3.0, latency_ms=1.0)
    scored = attempts.add(problem_ids[0], campaign_id, "PASSED", speedup=2.0, latency_ms=1.5, sol_score=0.7)
    finish(db, assignment_id, queue)
    assert best_of(db, campaign_id, problem_ids[0]) == scored

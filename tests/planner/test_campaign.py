"""Campaigns: round-robin assignment over idle writer slots, stopping, and the best attempt per problem."""

from __future__ import annotations

import hashlib
import itertools
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from services.planner.campaign import assignment_done, create_campaign, stop_campaign, tick
from shared.db import AssignmentRow, AttemptRow, CampaignProblemRow, CampaignRow, Database, SolutionRow
from shared.errors import NotFoundError, UserError
from shared.repository import upsert_problem
from shared.schema import load_problem

PROBLEMS = Path(__file__).resolve().parents[2] / "problems"
NAMES = ("llama31_8b_gemm_o_proj", "llama31_8b_rmsnorm", "llama31_8b_swiglu")
T0 = datetime(2026, 1, 1, 12, 0, 0)


class WriteQueue:
    """`send_write` that checks, from a fresh session, that the assignment it is sent is committed."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.sent: list[int] = []
        self.problems: list[int] = []  # the problem each sent assignment is for, in order

    def __call__(self, assignment_id: int) -> None:
        with self.db.session() as session:
            row = session.get(AssignmentRow, assignment_id)
            assert row is not None, f"assignment {assignment_id} sent before its commit"
            assert row.status == "QUEUED"
            self.problems.append(row.problem_id)
        self.sent.append(assignment_id)


@pytest.fixture
def db(tmp_path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path}/planner.db")
    yield database
    database.dispose()


@pytest.fixture
def problem_ids(db) -> list[int]:
    with db.session() as session:
        return [upsert_problem(session, load_problem(PROBLEMS / name)).id for name in NAMES]


@pytest.fixture
def queue(db) -> WriteQueue:
    return WriteQueue(db)


def campaign(db: Database, problem_ids: list[int], writers: int = 2, device: str = "cpu") -> int:
    return create_campaign(db, "c", problem_ids, device=device, writers=writers, attempts_per_assignment=3)


def active(db: Database, campaign_id: int) -> int:
    with db.session() as session:
        return session.scalar(select(func.count()).select_from(AssignmentRow).where(
            AssignmentRow.campaign_id == campaign_id, AssignmentRow.status.in_(("QUEUED", "RUNNING"))))


def best_of(db: Database, campaign_id: int, problem_id: int) -> str | None:
    with db.session() as session:
        return session.get(CampaignProblemRow, (campaign_id, problem_id)).best_attempt_id


class Attempts:
    """Writes one solution and one finished attempt per call, `minute` minutes after T0."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._counter = itertools.count()

    def add(self, problem_id: int, campaign_id: int | None, status: str, speedup: float | None = None,
            latency_ms: float | None = None, minute: int = 0) -> str:
        n = next(self._counter)
        digest = hashlib.sha256(f"solution-{n}".encode()).hexdigest()
        attempt_id = str(uuid.uuid4())
        with self.db.session() as session:
            session.add(SolutionRow(hash=digest, problem_id=problem_id, name=f"s{n}", author="tests",
                                    language="pytorch"))
            session.flush()
            session.add(AttemptRow(id=attempt_id, problem_id=problem_id, solution_hash=digest,
                                   campaign_id=campaign_id, status=status, device="cpu", speedup=speedup,
                                   latency_ms=latency_ms, created_at=T0 + timedelta(minutes=minute),
                                   finished_at=None if status in ("PENDING", "RUNNING")
                                   else T0 + timedelta(minutes=minute, seconds=30)))
        return attempt_id


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
        assignment_done(db, queue.sent[-2], queue)

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

    assert len(assignment_done(db, queue.sent[1], queue)) == 1
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
    assert assignment_done(db, queue.sent[0], queue) == []
    assert len(queue.sent) == 2
    with db.session() as session:
        row = session.get(CampaignRow, campaign_id)
        assert row.status == "STOPPED" and row.stopped_at is not None
        stopped_at = row.stopped_at
        assert session.get(AssignmentRow, queue.sent[0]).status == "DONE"

    stop_campaign(db, campaign_id)  # stopping twice keeps the first time
    with db.session() as session:
        assert session.get(CampaignRow, campaign_id).stopped_at == stopped_at


def test_assignment_done_marks_done_and_fills_the_freed_slot(db, problem_ids, queue):
    campaign_id = campaign(db, problem_ids, writers=1)
    (first,) = tick(db, campaign_id, queue)

    (second,) = assignment_done(db, first, queue)

    assert queue.sent == [first, second]
    with db.session() as session:
        row = session.get(AssignmentRow, first)
        assert row.status == "DONE" and row.finished_at is not None
        finished_at = row.finished_at
    assert assignment_done(db, first, queue) == []  # delivered twice: nothing changes, no extra slot
    with db.session() as session:
        assert session.get(AssignmentRow, first).finished_at == finished_at


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

    assignment_done(db, assignment_id, queue)

    assert best_of(db, campaign_id, problem) == early
    assert best_of(db, campaign_id, other) is None  # only the finished assignment's problem is updated


def test_failed_attempts_are_never_best(db, problem_ids, queue):
    campaign_id = campaign(db, problem_ids[:1], writers=1)
    (assignment_id,) = tick(db, campaign_id, queue)
    attempts = Attempts(db)
    for status in ("COMPILE_ERROR", "RUNTIME_ERROR", "TIMEOUT", "INCORRECT_SHAPE", "REWARD_HACK"):
        attempts.add(problem_ids[0], campaign_id, status, speedup=3.0, latency_ms=1.0)

    assignment_done(db, assignment_id, queue)

    assert best_of(db, campaign_id, problem_ids[0]) is None


def test_an_unknown_latency_does_not_win_a_tie(db, problem_ids, queue):
    campaign_id = campaign(db, problem_ids[:1], writers=1)
    (assignment_id,) = tick(db, campaign_id, queue)
    attempts = Attempts(db)
    attempts.add(problem_ids[0], campaign_id, "PASSED", speedup=2.0, latency_ms=None, minute=0)
    measured = attempts.add(problem_ids[0], campaign_id, "PASSED", speedup=2.0, latency_ms=4.0, minute=1)

    assignment_done(db, assignment_id, queue)

    assert best_of(db, campaign_id, problem_ids[0]) == measured


def test_the_best_moves_when_a_later_assignment_finds_a_faster_attempt(db, problem_ids, queue):
    problem = problem_ids[0]
    campaign_id = campaign(db, [problem], writers=1)
    (first,) = tick(db, campaign_id, queue)
    attempts = Attempts(db)
    slow = attempts.add(problem, campaign_id, "PASSED", speedup=1.2, latency_ms=3.0, minute=0)
    (second,) = assignment_done(db, first, queue)
    assert best_of(db, campaign_id, problem) == slow

    fast = attempts.add(problem, campaign_id, "PASSED", speedup=1.8, latency_ms=2.0, minute=5)
    assignment_done(db, second, queue)
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

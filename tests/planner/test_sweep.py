"""The sweep that keeps campaigns going when processes die: expired leases, lost evaluations,
lost `write` messages, and a tick for every running campaign."""

from __future__ import annotations

import threading
from datetime import timedelta

from sqlalchemy import select

from plannerkit import T0, Attempts, WriteQueue, add_problems, assignments, best_of
from services.planner import sweep as sweep_module
from services.planner.campaign import create_campaign, pause_campaign
from services.planner.sweep import Sweeper, expire_leases, resend_queued, sweep, time_out_attempts
from services.planner.tick import PlannerConfig, tick
from shared.db import AssignmentRow, AttemptRow, CampaignProblemRow, Database

NOW = T0 + timedelta(hours=2)


def new_campaign(db: Database, writers: int = 2, problems: int = 2) -> int:
    return create_campaign(db, "s", add_problems(db, problems), "cpu", writers, 2)


def first_problem(db: Database, campaign_id: int) -> int:
    with db.session() as session:
        return session.scalars(select(CampaignProblemRow.problem_id).where(
            CampaignProblemRow.campaign_id == campaign_id, CampaignProblemRow.position == 0)).one()


def set_assignment(db: Database, assignment_id: int, **fields) -> None:
    with db.session() as session:
        row = session.get(AssignmentRow, assignment_id)
        for name, value in fields.items():
            setattr(row, name, value)


def assignment_status(db: Database, assignment_id: int) -> str:
    with db.session() as session:
        return session.get(AssignmentRow, assignment_id).status


def test_running_assignments_past_their_lease_are_expired_and_their_slot_refilled(db, queue):
    campaign_id = new_campaign(db, writers=3)
    dead, alive, queued = tick(db, campaign_id, queue, now=T0)
    set_assignment(db, dead, status="RUNNING", lease_until=NOW - timedelta(seconds=1))
    set_assignment(db, alive, status="RUNNING", lease_until=NOW + timedelta(seconds=30))

    assert expire_leases(db, NOW, fallback_lease_s=3600) == [dead]

    assert [assignment_status(db, a) for a in (dead, alive, queued)] == ["EXPIRED", "RUNNING", "QUEUED"]
    (refill,) = tick(db, campaign_id, queue, now=NOW)
    assert refill not in (dead, alive, queued)


def test_a_running_assignment_without_a_lease_expires_after_the_fallback(db, queue):
    campaign_id = new_campaign(db)
    first, _ = tick(db, campaign_id, queue, now=T0)
    set_assignment(db, first, status="RUNNING", lease_until=None)
    assert expire_leases(db, T0 + timedelta(seconds=59), fallback_lease_s=60) == []
    assert expire_leases(db, T0 + timedelta(seconds=61), fallback_lease_s=60) == [first]


def test_attempts_without_a_verdict_past_the_deadline_time_out_with_a_message(db):
    campaign_id = new_campaign(db)
    problem = first_problem(db, campaign_id)
    attempts = Attempts(db)
    lost = attempts.add(problem, campaign_id, "PENDING", created_at=NOW - timedelta(seconds=601))
    crashed = attempts.add(problem, campaign_id, "RUNNING", created_at=NOW - timedelta(seconds=700))
    waiting = attempts.add(problem, campaign_id, "PENDING", created_at=NOW - timedelta(seconds=599))
    finished = attempts.add(problem, campaign_id, "PASSED", speedup=1.0, created_at=NOW - timedelta(hours=1))

    assert sorted(time_out_attempts(db, NOW, deadline_s=600)) == sorted([lost, crashed])

    with db.session() as session:
        rows = {a: session.get(AttemptRow, a) for a in (lost, crashed, waiting, finished)}
        assert [rows[a].status for a in (lost, crashed, waiting, finished)] == [
            "TIMEOUT", "TIMEOUT", "PENDING", "PASSED"]
        assert "no verdict 600 s after the attempt was recorded" in rows[lost].message
        assert rows[lost].finished_at == NOW
    assert time_out_attempts(db, NOW, deadline_s=600) == []  # once


def test_stale_attempts_without_a_campaign_time_out_as_the_others(db, problem_ids):
    """A problem's reference check submitted on the web when no campaign ran has no campaign: a
    lost one is finished by the sweep as a campaign's would be, not left in flight for ever."""
    attempts = Attempts(db)
    pending = attempts.add(problem_ids[0], None, "PENDING", created_at=NOW - timedelta(hours=1))
    running = attempts.add(problem_ids[1], None, "RUNNING", created_at=NOW - timedelta(hours=1))
    recent = attempts.add(problem_ids[2], None, "PENDING", created_at=NOW - timedelta(seconds=10))

    report = sweep(db, WriteQueue(db), lambda c: None, PlannerConfig(attempt_deadline_s=600), now=NOW)

    assert sorted(report.timed_out) == sorted([pending, running])
    with db.session() as session:
        rows = [session.get(AttemptRow, a) for a in (pending, running, recent)]
        assert [r.status for r in rows] == ["TIMEOUT", "TIMEOUT", "PENDING"]
        assert rows[0].message == sweep_module.LOST_MESSAGE.format(deadline_s=600)
        assert rows[1].finished_at == NOW


def test_queued_assignments_are_sent_again_all_at_start_and_old_ones_later(db):
    campaign_id = new_campaign(db, writers=2)
    old, new = tick(db, campaign_id, WriteQueue(db), now=T0)
    set_assignment(db, new, created_at=NOW - timedelta(seconds=10))
    paused = new_campaign(db, writers=1)
    tick(db, paused, WriteQueue(db), now=T0)
    pause_campaign(db, paused)

    queue = WriteQueue(db)
    assert resend_queued(db, queue, older_than=None) == [old, new]  # a paused campaign's wait for resume
    assert resend_queued(db, queue, older_than=NOW - timedelta(seconds=60)) == [old]


def test_a_sweep_at_start_refreshes_bests_and_ticks_every_running_campaign(db):
    running, paused = new_campaign(db), new_campaign(db)
    pause_campaign(db, paused)
    problem = first_problem(db, running)
    best = Attempts(db).add(problem, running, "PASSED", speedup=2.0)  # its done message was lost
    ticks: list[int] = []

    report = sweep(db, WriteQueue(db), ticks.append, PlannerConfig(), now=NOW, starting=True)

    assert ticks == [running] and report.ticked == (running,)
    assert best_of(db, running, problem) == best


def test_the_sweeper_thread_sweeps_at_start_then_periodically(db):
    new_campaign(db)
    swept = threading.Event()
    ticks: list[int] = []

    def send_tick(campaign_id: int) -> None:
        ticks.append(campaign_id)
        if len(ticks) >= 2:
            swept.set()

    sweeper = Sweeper(lambda: db, WriteQueue(db), send_tick, PlannerConfig(sweep_every_s=0.05))
    sweeper.start()
    try:
        assert swept.wait(5)
    finally:
        sweeper.stop()
    assert len(set(ticks)) == 1


def test_a_tick_after_a_planner_crash_between_commit_and_send_loses_nothing(db):
    """The planner died after committing two assignments and before sending them: the start-up
    sweep sends them, and the tick creates nothing more."""
    campaign_id = new_campaign(db, writers=2)

    def crash(_: int) -> None:
        raise SystemExit("killed")

    try:
        tick(db, campaign_id, crash, now=T0)
    except SystemExit:
        pass
    created = [a.id for a in assignments(db, campaign_id)]
    assert len(created) == 2

    queue = WriteQueue(db)
    sweep(db, queue, lambda c: tick(db, c, queue, now=NOW), PlannerConfig(), now=NOW, starting=True)
    assert queue.sent == created  # sent again, nothing new
    assert len(assignments(db, campaign_id)) == 2


def test_pending_attempts_are_sent_again_when_their_writer_died_or_the_broker_lost_them(db, queue):
    campaign_id = new_campaign(db, writers=2)
    dead, alive = tick(db, campaign_id, queue, now=T0)
    set_assignment(db, dead, status="RUNNING", lease_until=NOW - timedelta(seconds=1))
    set_assignment(db, alive, status="RUNNING", lease_until=NOW + timedelta(seconds=30))
    problem = first_problem(db, campaign_id)
    attempts = Attempts(db)
    orphan = attempts.add(problem, campaign_id, "PENDING", assignment_id=dead, minute=100)  # never sent?
    waiting = attempts.add(problem, campaign_id, "PENDING", assignment_id=alive, minute=100)
    attempts.add(problem, campaign_id, "PASSED", speedup=1.2, assignment_id=dead, minute=90)
    sent: list[tuple[str, str]] = []
    config = PlannerConfig(resend_pending_s=4 * 3600)  # not yet lost (tests/attacks/test_faults.py: after that)

    report = sweep(db, queue, lambda c: None, config, now=NOW, send_evaluate=lambda *a: sent.append(a))
    assert report.expired == (dead,) and sent == [(orphan, "cpu")]  # the live writer's own is left to it

    sent.clear()
    report = sweep(db, queue, lambda c: None, PlannerConfig(), now=NOW, send_evaluate=lambda *a: sent.append(a),
                   broker_lost=True)
    assert sorted(sent) == sorted([(orphan, "cpu"), (waiting, "cpu")])  # a new Redis: every pending one


def test_after_a_lost_broker_pending_attempts_without_a_campaign_are_sent_again(db, queue):
    """Those of a paused campaign wait for its resume; those without a campaign go again at once."""
    paused = new_campaign(db)
    pause_campaign(db, paused)
    problem = first_problem(db, paused)
    attempts = Attempts(db)
    outside = attempts.add(problem, None, "PENDING", minute=100)
    attempts.add(problem, paused, "PENDING", minute=100)
    sent: list[tuple[str, str]] = []

    report = sweep(db, queue, lambda c: None, PlannerConfig(), now=NOW, send_evaluate=lambda *a: sent.append(a),
                   broker_lost=True)

    assert sent == [(outside, "cpu")] and report.reevaluated == (outside,)


def test_the_sweeper_notices_a_new_broker_instance(db, monkeypatch):
    epochs = iter(["run-1", "run-1", "run-2"])
    lost: list[bool] = []
    swept = threading.Event()
    original = sweep_module.sweep

    def recording(*args, broker_lost=False, **kwargs):
        lost.append(broker_lost)
        if len(lost) >= 3:
            swept.set()
        return original(*args, broker_lost=broker_lost, **kwargs)

    monkeypatch.setattr(sweep_module, "sweep", recording)
    sweeper = Sweeper(lambda: db, WriteQueue(db), lambda c: None, PlannerConfig(sweep_every_s=0.01),
                      lambda attempt_id, device: None, lambda: next(epochs, "run-2"))
    sweeper.start()
    assert swept.wait(30)
    sweeper.stop()
    assert lost[:3] == [False, False, True]  # the run id changed between the second and third sweep

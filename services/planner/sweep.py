"""What keeps a campaign going when processes die: run by the planner at start-up and then every
`sweep_every_s`, whether or not any message arrives.

- A RUNNING assignment whose lease ran out (its writer died) is closed as EXPIRED; the next tick
  fills its slot. A writer that comes back finds it closed and stops.
- An attempt without a verdict `attempt_deadline_s` after it was recorded is marked TIMEOUT with a
  message, not sent again: its evaluator may have died running it (a kernel that kills its worker
  is not re-run), and its writer has long stopped waiting. A verdict that still arrives wins. This
  holds for attempts without a campaign too (a problem's reference check submitted on the web).
- An attempt whose evaluation is lost is sent again within minutes, not at the deadline: a RUNNING
  one whose evaluator stopped its heartbeat (`attempts.seen_at`) for `stalled_after_s` (it died, froze,
  or its task ended without a verdict: a DB write that failed) goes back to PENDING, and a PENDING one
  not looked after for `resend_pending_s` (its message lost: a task that failed before it could
  retry) has its `evaluate` sent again. An attempt that still runs beats, so it is never sent again;
  the evaluator's claim makes a duplicate harmless, and its count of tries quarantines an attempt
  whose evaluator died under it twice.
- A QUEUED assignment whose `write` task may be lost (the planner died between commit and send, or
  the broker lost it) is sent again: all of them at start-up, those older than `requeue_after_s`
  later. A duplicate is harmless: only one writer can claim an assignment.
- Every RUNNING campaign gets a tick (a resumed or new campaign starts; one whose done messages
  were lost goes on).
- At start-up, and whenever the broker is a new instance (Redis restarted without its data: every
  queued message is gone), the PENDING attempts of running campaigns and those without a campaign
  get their `evaluate` sent again, and every QUEUED assignment its `write`. So do the PENDING
  attempts of an assignment whose lease just ran out (its writer may have died between recording an
  attempt and sending it). A duplicate is harmless: the evaluator claims an attempt before it runs
  it (`services/evaluator/record.py`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from kombu.exceptions import OperationalError as KombuOperationalError
from redis.exceptions import RedisError
from sqlalchemy import func, or_, select, update
from sqlalchemy.exc import SQLAlchemyError

from services.planner.best import update_bests
from services.planner.policy import LLM
from services.planner.state import IN_FLIGHT
from services.planner.tick import RUNNING, PlannerConfig, SendWrite
from shared.db import AssignmentRow, AttemptRow, CampaignRow, Database, utcnow

log = logging.getLogger(__name__)

SendTick = Callable[[int], None]
SendEvaluate = Callable[[str, str], None]  # attempt id, device
BrokerEpoch = Callable[[], str | None]  # changes when the broker restarts and loses its messages
LOST_MESSAGE = ("no verdict {deadline_s:.0f} s after the attempt was recorded: its evaluation was lost "
                "(the evaluator died or the task was dropped); marked TIMEOUT by the planner")


@dataclass(frozen=True)
class SweepReport:
    expired: tuple[int, ...]  # assignments
    timed_out: tuple[str, ...]  # attempts
    resent: tuple[int, ...]  # assignments
    ticked: tuple[int, ...]  # campaigns
    reevaluated: tuple[str, ...] = ()  # attempts whose `evaluate` was sent again
    revived: tuple[str, ...] = ()  # attempts stalled or lost in flight, sent again


def expire_leases(db: Database, now: datetime, fallback_lease_s: float) -> list[int]:
    """Close RUNNING assignments whose lease ran out (or, without a lease, that are older than
    `fallback_lease_s`)."""
    with db.session() as session:
        expired = list(session.scalars(select(AssignmentRow.id).where(
            AssignmentRow.status == "RUNNING",
            or_(AssignmentRow.lease_until < now,
                AssignmentRow.lease_until.is_(None) & (AssignmentRow.created_at < now - timedelta(
                    seconds=fallback_lease_s))))))
        if expired:
            session.execute(update(AssignmentRow)
                            .where(AssignmentRow.id.in_(expired), AssignmentRow.status == "RUNNING")
                            .values(status="EXPIRED", finished_at=now))
    for assignment_id in expired:
        log.warning("assignment=%s lease expired: closed as EXPIRED", assignment_id)
    return expired


def time_out_attempts(db: Database, now: datetime, deadline_s: float) -> list[str]:
    """Mark TIMEOUT the attempts, of a campaign or not, still in flight `deadline_s` after they were
    recorded."""
    cutoff = now - timedelta(seconds=deadline_s)
    with db.session() as session:
        stale = list(session.scalars(select(AttemptRow.id).where(
            AttemptRow.status.in_(IN_FLIGHT), AttemptRow.created_at < cutoff)))
        if stale:
            session.execute(update(AttemptRow).where(AttemptRow.id.in_(stale), AttemptRow.status.in_(IN_FLIGHT))
                            .values(status="TIMEOUT", finished_at=now,
                                    message=LOST_MESSAGE.format(deadline_s=deadline_s)))
    for attempt_id in stale:
        log.warning("attempt=%s no verdict after %.0f s: TIMEOUT", attempt_id, deadline_s)
    return stale


def resend_queued(db: Database, send_write: SendWrite, older_than: datetime | None) -> list[int]:
    """Send `write` again for the QUEUED assignments of running campaigns (created before
    `older_than`, when given)."""
    with db.session() as session:
        query = (select(AssignmentRow.id).join(CampaignRow, CampaignRow.id == AssignmentRow.campaign_id)
                 .where(AssignmentRow.status == "QUEUED", CampaignRow.status == RUNNING).order_by(AssignmentRow.id))
        if older_than is not None:
            query = query.where(AssignmentRow.created_at < older_than)
        queued = list(session.scalars(query))
    if queued:
        send_write(queued)
        log.info("sent write again for queued assignments=%s", queued)
    return queued


def resend_pending(db: Database, send_evaluate: SendEvaluate, assignments: list[int] | None = None) -> list[str]:
    """Send `evaluate` again for the PENDING attempts of running campaigns and those without a
    campaign (of `assignments` only, when given)."""
    if assignments == []:
        return []
    with db.session() as session:
        query = (select(AttemptRow.id, AttemptRow.device)
                 .outerjoin(CampaignRow, CampaignRow.id == AttemptRow.campaign_id)
                 .where(AttemptRow.status == "PENDING",
                        or_(AttemptRow.campaign_id.is_(None), CampaignRow.status == RUNNING))
                 .order_by(AttemptRow.created_at))
        if assignments is not None:
            query = query.where(AttemptRow.assignment_id.in_(assignments))
        pending = session.execute(query).all()
    for attempt_id, device in pending:
        send_evaluate(attempt_id, device)
    if pending:
        log.info("sent evaluate again for %d pending attempts", len(pending))
    return [p.id for p in pending]


def revive_stalled(db: Database, send_evaluate: SendEvaluate, now: datetime, stalled_after_s: float,
                   resend_pending_s: float, sent: tuple[str, ...] = ()) -> list[str]:
    """RUNNING attempts without a heartbeat for `stalled_after_s` back to PENDING, and `evaluate`
    sent again for them and for the PENDING attempts (of running campaigns, or of none) not looked
    after for `resend_pending_s`; `seen_at` records the sending, so each goes again once a period.
    `sent`: attempts this sweep already sent (not sent twice)."""
    seen = func.coalesce(AttemptRow.seen_at, AttemptRow.started_at, AttemptRow.created_at)
    stalled_cutoff, pending_cutoff = now - timedelta(seconds=stalled_after_s), now - timedelta(seconds=resend_pending_s)
    with db.session() as session:
        stalled = list(session.scalars(select(AttemptRow.id).where(AttemptRow.status == "RUNNING",
                                                                   seen < stalled_cutoff)))
        if stalled:
            session.execute(update(AttemptRow).where(AttemptRow.id.in_(stalled), AttemptRow.status == "RUNNING",
                                                     seen < stalled_cutoff)
                            .values(status="PENDING", evaluator=None, seen_at=now)
                            .execution_options(synchronize_session=False))
        lost = list(session.execute(
            select(AttemptRow.id, AttemptRow.device).outerjoin(CampaignRow, CampaignRow.id == AttemptRow.campaign_id)
            .where(AttemptRow.status == "PENDING", or_(AttemptRow.id.in_(stalled), seen < pending_cutoff),
                   or_(AttemptRow.campaign_id.is_(None), CampaignRow.status == RUNNING))
            .order_by(AttemptRow.created_at)).all())
        if lost:
            session.execute(update(AttemptRow).where(AttemptRow.id.in_([r.id for r in lost]),
                                                     AttemptRow.status == "PENDING")
                            .values(seen_at=now).execution_options(synchronize_session=False))
    for attempt_id in stalled:
        log.warning("attempt=%s: its evaluator gave no sign of life for %.0f s: sent again", attempt_id,
                    stalled_after_s)
    for attempt_id, device in lost:
        if attempt_id not in sent:
            send_evaluate(attempt_id, device)
    if lost:
        log.info("sent evaluate again for %d attempts stalled or lost in flight", len(lost))
    return [r.id for r in lost]


def sweep(db: Database, send_write: SendWrite, send_tick: SendTick, config: PlannerConfig,
          now: datetime | None = None, starting: bool = False, send_evaluate: SendEvaluate | None = None,
          broker_lost: bool = False) -> SweepReport:
    """One pass. `starting`: the planner just started; `broker_lost`: the broker lost its queues."""
    now = now or utcnow()
    expired = expire_leases(db, now, config.attempt_deadline_s)
    timed_out = time_out_attempts(db, now, config.attempt_deadline_s)
    everything = starting or broker_lost
    resent = resend_queued(db, send_write, None if everything else now - timedelta(seconds=config.requeue_after_s))
    reevaluated: list[str] = []
    revived: list[str] = []
    if send_evaluate is not None:
        # A writer that died between recording an attempt and sending it left no message: the
        # attempts of the assignments whose lease just ran out go again (after a lost broker, all).
        reevaluated = resend_pending(db, send_evaluate, None if everything else expired)
        revived = revive_stalled(db, send_evaluate, now, config.stalled_after_s, config.resend_pending_s,
                                 tuple(reevaluated))
    with db.session() as session:
        running = list(session.scalars(select(CampaignRow.id).where(CampaignRow.status == RUNNING)))
    for campaign_id in running:
        if starting:  # done messages may have been lost with the planner
            with db.session() as session:
                update_bests(session, campaign_id)
        send_tick(campaign_id)
    return SweepReport(tuple(expired), tuple(timed_out), tuple(resent), tuple(running), tuple(reevaluated),
                       tuple(revived))


class Sweeper:
    """A daemon thread of the planner process: one sweep at start, then one every `sweep_every_s`.
    It only writes rows and sends messages; the ticks run as tasks in the planner's main loop."""

    def __init__(self, db_factory: Callable[[], Database], send_write: SendWrite, send_tick: SendTick,
                 config: PlannerConfig, send_evaluate: SendEvaluate | None = None,
                 broker_epoch: BrokerEpoch | None = None) -> None:
        self.db_factory, self.send_write, self.send_tick, self.config = db_factory, send_write, send_tick, config
        self.send_evaluate, self.broker_epoch = send_evaluate, broker_epoch
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="planner-sweeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        starting, epoch = True, None
        while not self._stop.is_set():
            try:
                now_epoch = self.broker_epoch() if self.broker_epoch else None
                broker_lost = epoch is not None and now_epoch is not None and now_epoch != epoch
                if broker_lost:
                    log.warning("the broker restarted (%s -> %s): sending queued work again", epoch, now_epoch)
                report = sweep(self.db_factory(), self.send_write, self.send_tick, self.config, starting=starting,
                               send_evaluate=self.send_evaluate, broker_lost=broker_lost)
                starting, epoch = False, now_epoch or epoch
                self._advise(report.ticked)
                log.debug("sweep: %s", report)
            except (SQLAlchemyError, KombuOperationalError, RedisError, OSError):  # DB or broker down: next period
                log.exception("sweep failed; retrying in %.0f s", self.config.sweep_every_s)
            self._stop.wait(self.config.sweep_every_s)

    def _advise(self, running: tuple[int, ...]) -> None:
        """Ask the LLM planner about the running `llm` campaigns that are due (here, not in a tick)."""
        advisor = self.config.advisor
        if advisor is None or not running:
            return
        db = self.db_factory()
        with db.session() as session:
            advised = list(session.scalars(select(CampaignRow.id).where(CampaignRow.id.in_(running),
                                                                       CampaignRow.policy == LLM)))
        for campaign_id in advised:
            if advisor.due(campaign_id) and advisor.refresh(db, campaign_id, self.config.policy) is not None:
                self.send_tick(campaign_id)  # the new advice is used at once

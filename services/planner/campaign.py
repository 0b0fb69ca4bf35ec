"""Campaigns: create (validated), pause, resume, stop, list; the best attempt per problem; what to
do when a writer reports an assignment finished. The ticks themselves live in `tick.py`.

Statuses: RUNNING (ticks assign), PAUSED (no new assignments; writers end theirs after the attempt
in hand), STOPPED (final). The web flips RUNNING and PAUSED directly in the DB and sends
`planner.tick` on resume; nothing here depends on who made the change.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select

from services.planner.best import update_best
from services.planner.policy import DEFAULT_POLICY, POLICIES
from services.planner.state import ACTIVE, StateCache
from services.planner.tick import PAUSED, RUNNING, STOPPED, PlannerConfig, SendWrite, tick
from shared.db import (AssignmentRow, AttemptRow, CampaignProblemRow, CampaignRow, Database, ProblemRow,
                       utcnow)
from shared.errors import NotFoundError, UserError

log = logging.getLogger(__name__)

FINISHED_ASSIGNMENT = ("DONE", "CANCELLED", "EXPIRED")


@dataclass(frozen=True)
class Budgets:
    """Unset (None) means unlimited."""

    attempts: int | None = None
    gpu_s: float | None = None
    tokens: int | None = None
    wall_s: float | None = None


@dataclass(frozen=True)
class CampaignSummary:
    id: int
    name: str
    status: str
    policy: str
    device: str
    writers: int
    problems: int
    active_assignments: int
    attempts: int
    gpu_s: float
    tokens: int
    budgets: Budgets
    created_at: datetime
    stopped_at: datetime | None
    status_reason: str | None = None  # why STOPPED or PAUSED, or why RUNNING and idle
    continuous: bool = False


def create_campaign(db: Database, name: str, problem_ids: list[int], device: str, writers: int,
                    attempts_per_assignment: int, *, policy: str = DEFAULT_POLICY,
                    budgets: Budgets = Budgets(), continuous: bool = False) -> int:
    """A RUNNING campaign over `problem_ids`, in that order; nothing is assigned until a tick.
    `continuous`: it does not stop when every problem is retired, but waits, RUNNING, for a problem
    that joins it or a writer that can do more (`tick.idle`); budgets still end it."""
    _validate(name, problem_ids, writers, attempts_per_assignment, policy, budgets)
    with db.session() as session:
        known = set(session.scalars(select(ProblemRow.id).where(ProblemRow.id.in_(problem_ids))))
        unknown = [p for p in problem_ids if p not in known]
        if unknown:
            raise UserError(f"no problem with id {', '.join(map(str, unknown))}")
        campaign = CampaignRow(name=name, device=device, writers=writers, policy=policy,
                               attempts_per_assignment=attempts_per_assignment, status=RUNNING,
                               budget_attempts=budgets.attempts, budget_gpu_s=budgets.gpu_s,
                               budget_tokens=budgets.tokens, budget_wall_s=budgets.wall_s, continuous=continuous)
        session.add(campaign)
        session.flush()
        for position, problem_id in enumerate(problem_ids):
            session.add(CampaignProblemRow(campaign_id=campaign.id, problem_id=problem_id, position=position))
        return campaign.id


def _validate(name: str, problem_ids: list[int], writers: int, attempts_per_assignment: int, policy: str,
              budgets: Budgets) -> None:
    if not name.strip():
        raise UserError("a campaign needs a name")
    if not problem_ids:
        raise UserError("a campaign needs at least one problem")
    duplicates = sorted({p for p in problem_ids if problem_ids.count(p) > 1})
    if duplicates:
        raise UserError(f"problem ids given twice: {', '.join(map(str, duplicates))}")
    if writers <= 0:
        raise UserError(f"writers must be at least 1, not {writers}")
    if attempts_per_assignment <= 0:
        raise UserError(f"attempts per assignment must be at least 1, not {attempts_per_assignment}")
    if policy not in POLICIES:
        raise UserError(f"unknown policy {policy!r}: choose one of {', '.join(POLICIES)}")
    for what, value in (("attempts", budgets.attempts), ("GPU-seconds", budgets.gpu_s),
                        ("tokens", budgets.tokens), ("wall-time", budgets.wall_s)):
        if value is not None and value <= 0:
            raise UserError(f"the {what} budget must be positive, not {value}")


def stop_campaign(db: Database, campaign_id: int, reason: str = "stopped by request") -> str:
    """STOPPED for good (stopping twice keeps the first time and reason). Returns the new status."""
    with db.session() as session:
        campaign = _campaign(session, campaign_id)
        if campaign.status != STOPPED:
            campaign.status, campaign.stopped_at, campaign.status_reason = STOPPED, utcnow(), reason
        return campaign.status


def pause_campaign(db: Database, campaign_id: int, reason: str = "paused by request") -> str:
    with db.session() as session:
        campaign = _campaign(session, campaign_id)
        if campaign.status == STOPPED:
            raise UserError(f"campaign {campaign_id} is stopped; it cannot be paused")
        campaign.status, campaign.status_reason = PAUSED, reason
        return campaign.status


def resume_campaign(db: Database, campaign_id: int) -> str:
    """RUNNING again; the caller sends `planner.tick` (or the planner's next sweep picks it up)."""
    with db.session() as session:
        campaign = _campaign(session, campaign_id)
        if campaign.status == STOPPED:
            raise UserError(f"campaign {campaign_id} is stopped; create a new one instead")
        campaign.status, campaign.status_reason = RUNNING, None
        return campaign.status


def add_problems(db: Database, campaign_id: int, problem_ids: list[int]) -> list[int]:
    """Join the problems the campaign does not have yet, after its others; returns those added."""
    with db.session() as session:
        _campaign(session, campaign_id)
        have = dict(session.execute(select(CampaignProblemRow.problem_id, CampaignProblemRow.position)
                                    .where(CampaignProblemRow.campaign_id == campaign_id)).all())
        added = [p for p in dict.fromkeys(problem_ids) if p not in have]
        start = max(have.values(), default=-1) + 1
        for offset, problem_id in enumerate(added):
            session.add(CampaignProblemRow(campaign_id=campaign_id, problem_id=problem_id, position=start + offset))
        return added


def list_campaigns(db: Database) -> list[CampaignSummary]:
    with db.session() as session:
        campaigns = session.scalars(select(CampaignRow).order_by(CampaignRow.id)).all()
        problems = dict(session.execute(select(CampaignProblemRow.campaign_id, func.count())
                                        .group_by(CampaignProblemRow.campaign_id)).all())
        active = dict(session.execute(select(AssignmentRow.campaign_id, func.count())
                                      .where(AssignmentRow.status.in_(ACTIVE))
                                      .group_by(AssignmentRow.campaign_id)).all())
        spent = {row.campaign_id: row for row in session.execute(
            select(AttemptRow.campaign_id, func.count().label("attempts"),
                   func.coalesce(func.sum(AttemptRow.gpu_seconds), 0.0).label("gpu_s"),
                   func.coalesce(func.sum(AttemptRow.tokens), 0).label("tokens"))
            .where(AttemptRow.campaign_id.is_not(None)).group_by(AttemptRow.campaign_id))}
        unattributed = dict(session.execute(select(AssignmentRow.campaign_id, func.sum(AssignmentRow.tokens))
                                            .group_by(AssignmentRow.campaign_id)).all())  # turns without an attempt
        return [CampaignSummary(
            c.id, c.name, c.status, c.policy, c.device, c.writers, problems.get(c.id, 0), active.get(c.id, 0),
            spent[c.id].attempts if c.id in spent else 0, float(spent[c.id].gpu_s) if c.id in spent else 0.0,
            (int(spent[c.id].tokens) if c.id in spent else 0) + int(unattributed.get(c.id) or 0),
            Budgets(c.budget_attempts, c.budget_gpu_s, c.budget_tokens, c.budget_wall_s), c.created_at, c.stopped_at,
            c.status_reason, c.continuous)
            for c in campaigns]


def assignment_done(db: Database, assignment_id: int, send_write: SendWrite,
                    config: PlannerConfig = PlannerConfig(), cache: StateCache | None = None) -> list[int]:
    """A writer finished the assignment (it set the status itself): record the problem's best and
    fill the freed slot. Idempotent: a redelivered message records the same best and, the slot
    being filled already, assigns nothing.

    With the planner's `cache`, a report costs no DB access when the last tick already saw the
    assignment closed (in a burst of reports the first tick refills every freed slot), and the
    best is recorded by the tick, for every problem whose assignments closed."""
    if cache is not None:
        if cache.seen_closed(assignment_id):
            return []
        known = cache.active_problem(assignment_id)
        if known is not None:
            cache.mark(*known)
            return tick(db, known[0], send_write, config, cache=cache)
    with db.session() as session:
        assignment = session.get(AssignmentRow, assignment_id)
        if assignment is None:
            raise NotFoundError(f"no assignment {assignment_id}")
        if assignment.status not in FINISHED_ASSIGNMENT:
            log.warning("assignment=%s reported done while %s", assignment_id, assignment.status)
        update_best(session, assignment.campaign_id, assignment.problem_id)
        campaign_id, problem_id = assignment.campaign_id, assignment.problem_id
    if cache is not None:
        cache.mark(campaign_id, problem_id)
        if cache.counted_free(campaign_id, assignment_id):
            return []
    return tick(db, campaign_id, send_write, config, cache=cache)


def _campaign(session, campaign_id: int) -> CampaignRow:
    campaign = session.get(CampaignRow, campaign_id)
    if campaign is None:
        raise NotFoundError(f"no campaign {campaign_id}")
    return campaign


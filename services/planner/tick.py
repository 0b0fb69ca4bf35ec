"""One planning tick: fill the campaign's idle writer slots, within its budgets.

Safe to run any number of times, concurrently, from any process: a cheap read returns early when no
slot is free; otherwise the campaign row is locked (`SELECT ... FOR UPDATE` on PostgreSQL; on SQLite
a write to the row first, which takes the database's write lock before anything is read), the slots
are counted again under the lock, and the new assignments are committed before their `write` tasks
are sent. Concurrent ticks therefore never hold more than `writers` active assignments.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from services.planner.best import update_bests
from services.planner.brief import Brief, default_language, guidance, parent_for
from services.planner.advisor import Advisor, choose_advised
from services.planner.policy import LLM, POLICIES, PolicyConfig, choose
from services.planner.state import (
    CampaignState, StateCache, count_active, parent_candidates, read_state, recent_attempts,
)
from shared.db import AssignmentRow, CampaignRow, Database, utcnow
from shared.errors import NotFoundError

log = logging.getLogger(__name__)

SendWrite = Callable[[Sequence[int]], None]  # sends `worker.write` for each assignment id
RUNNING, PAUSED, STOPPED = "RUNNING", "PAUSED", "STOPPED"
IDLE = "idle"  # a continuous campaign's status_reason begins so while it has nothing to assign


@dataclass(frozen=True)
class PlannerConfig:
    """Knobs of the planner process. `attempt_deadline_s`: an attempt without a verdict this long
    after it was recorded is marked TIMEOUT; `requeue_after_s`: a QUEUED assignment this old has
    its `write` task sent again (the claim makes a duplicate harmless); `sweep_every_s`: how often
    the planner sweeps (leases, deadlines, queued assignments) and ticks every running campaign;
    `stalled_after_s`: a RUNNING attempt whose evaluator gave no heartbeat this long goes back to
    PENDING and is sent again; `resend_pending_s`: a PENDING attempt not looked after this long has
    its `evaluate` sent again (both: the claim makes a duplicate harmless)."""

    policy: PolicyConfig = field(default_factory=PolicyConfig)
    attempt_deadline_s: float = 3600.0
    requeue_after_s: float = 600.0
    stalled_after_s: float = 180.0  # six missed heartbeats (services/evaluator/record.py, HEARTBEAT_S)
    resend_pending_s: float = 300.0
    sweep_every_s: float = 15.0
    advisor: Advisor | None = field(default=None, compare=False)  # the LLM planner (policy `llm`), if configured


def tick(db: Database, campaign_id: int, send_write: SendWrite, config: PlannerConfig = PlannerConfig(),
         now: datetime | None = None, cache: StateCache | None = None) -> list[int]:
    """Give every idle writer slot an assignment; returns the ids created (and sent). `cache`: the
    planner process's `StateCache` (without one, the whole state is read)."""
    now = now or utcnow()
    with db.session() as session:  # the common case after a burst of finished assignments: no slot
        campaign = session.get(CampaignRow, campaign_id)
        if campaign is None:
            raise NotFoundError(f"no campaign {campaign_id}")
        if campaign.status != RUNNING or (
                not _wall_spent(campaign, now) and count_active(session, campaign_id) >= campaign.writers):
            return []
    with db.session() as session:
        campaign = lock_campaign(session, campaign_id)
        created = _fill(session, campaign, config, now, cache) if campaign.status == RUNNING else []
    if created:
        send_write(created)  # after the commit, so the writer finds the rows
        log.info("campaign=%s assigned=%d ids=%s", campaign_id, len(created),
                 created if len(created) <= 8 else f"{created[0]}..{created[-1]}")
    return created


def lock_campaign(session: Session, campaign_id: int) -> CampaignRow:
    """The campaign row, locked until the session ends; concurrent lockers wait."""
    if session.get_bind().dialect.name == "sqlite":  # BEGIN + a write: the DB-wide write lock, now
        session.execute(update(CampaignRow).where(CampaignRow.id == campaign_id)
                        .values(next_index=CampaignRow.next_index))
    campaign = session.scalars(select(CampaignRow).where(CampaignRow.id == campaign_id)
                               .with_for_update().execution_options(populate_existing=True)).first()
    if campaign is None:
        raise NotFoundError(f"no campaign {campaign_id}")
    return campaign


def _fill(session: Session, campaign: CampaignRow, config: PlannerConfig, now: datetime,
          cache: StateCache | None) -> list[int]:
    state = read_state(session, campaign.id, config.policy, cache, count_recorded=campaign.budget_attempts is not None,
                       count_unattributed=campaign.budget_tokens is not None)
    if cache is not None and (state.refreshed is None or state.refreshed):
        # Reports skipped recording the best: done here, for the problems read again (None: all of
        # them, a full refresh).
        update_bests(session, campaign.id, state.refreshed)
    created = _assign(session, campaign, state, config, now)
    if cache is not None:
        active = {a.assignment_id: a.problem_id for a in state.active}
        cache.remember_active(campaign.id, active | dict(created))
    return [assignment_id for assignment_id, _ in created]


def _assign(session: Session, campaign: CampaignRow, state: CampaignState, config: PlannerConfig,
            now: datetime) -> list[tuple[int, int]]:
    """The new assignments as (id, problem), in the policy's order; or the campaign finished."""
    spent_on = _spent_budget(campaign, state, now)
    if spent_on:
        finish_campaign(campaign, now, f"{spent_on} budget spent")
        return []
    slots = campaign.writers - len(state.active)
    attempts_left = _attempts_left(campaign, state)
    if slots <= 0 or attempts_left <= 0:
        if attempts_left <= 0 and not state.active:
            finish_campaign(campaign, now, "attempt budget spent")
        return []
    per_assignment = campaign.attempts_per_assignment
    policy = campaign.policy if campaign.policy in POLICIES else POLICIES[0]
    advice = config.advisor.latest(campaign.id) if policy == LLM and config.advisor is not None else None
    if policy == LLM:  # the model's checked advice first; the default policy for the rest (or all)
        plan = choose_advised(advice, state.problems, slots, per_assignment, config.policy, campaign.next_index)
    else:
        plan = choose(policy, state.problems, slots, per_assignment, config.policy, campaign.next_index)
    campaign.next_index = plan.cursor
    if not plan.problem_ids:
        if not state.active:
            reason = f"every problem retired ({len(plan.retired)})"
            if campaign.continuous:
                idle(campaign, f"{IDLE}: {reason}")
            else:
                finish_campaign(campaign, now, reason)
        return []
    if campaign.status_reason:  # it was idle
        log.info("campaign=%s working again", campaign.id)
        campaign.status_reason = None
    briefs = _briefs(session, campaign, state, plan.problem_ids, config.policy)
    if advice is not None:
        for problem_id, text in advice.guidance.items():
            if problem_id in briefs and text:
                brief = briefs[problem_id]
                briefs[problem_id] = replace(brief, guidance=f"Planner: {text}" + (
                    f"\n{brief.guidance}" if brief.guidance else ""))
    rows = []
    for problem_id in plan.problem_ids:
        budget = min(per_assignment, attempts_left)
        if budget <= 0:
            break
        attempts_left -= budget
        brief = briefs[problem_id]
        rows.append({"campaign_id": campaign.id, "problem_id": problem_id, "budget_attempts": budget,
                     "status": "QUEUED", "language": brief.language, "parent_hash": brief.parent_hash,
                     "guidance": brief.guidance, "created_at": now})
    if not rows:
        return []
    ids = session.scalars(insert(AssignmentRow).returning(AssignmentRow.id, sort_by_parameter_order=True), rows)
    return [(assignment_id, row["problem_id"]) for assignment_id, row in zip(ids, rows, strict=True)]


def _briefs(session: Session, campaign: CampaignRow, state: CampaignState, problem_ids: tuple[int, ...],
            config: PolicyConfig) -> dict[int, Brief]:
    chosen = sorted(set(problem_ids))
    candidates = parent_candidates(session, campaign.id, chosen)
    recent = recent_attempts(session, campaign.id, chosen)
    stall = {p.problem_id: p.stall for p in state.problems}
    briefs = {}
    for problem_id in chosen:
        parent = parent_for(candidates.get(problem_id, []), stall[problem_id], config.diverse_after)
        briefs[problem_id] = Brief(parent.language if parent else default_language(campaign.device),
                                   parent.solution_hash if parent else None,
                                   guidance(recent.get(problem_id, []), stall[problem_id]))
    return briefs


def _attempts_left(campaign: CampaignRow, state: CampaignState) -> int:
    """Attempts the campaign may still promise: its budget less those recorded and those promised
    to active assignments. Unlimited without a budget."""
    if campaign.budget_attempts is None:
        return 1 << 30
    promised = sum(max(0, a.budget - a.made) for a in state.active)
    return campaign.budget_attempts - state.spent.attempts - promised


def _spent_budget(campaign: CampaignRow, state: CampaignState, now: datetime) -> str | None:
    if campaign.budget_gpu_s is not None and state.spent.gpu_s >= campaign.budget_gpu_s:
        return "GPU-seconds"
    if campaign.budget_tokens is not None and state.spent.tokens >= campaign.budget_tokens:
        return "token"
    if _wall_spent(campaign, now):
        return "wall-time"
    return None


def _wall_spent(campaign: CampaignRow, now: datetime) -> bool:
    return campaign.budget_wall_s is not None and now >= campaign.created_at + timedelta(
        seconds=campaign.budget_wall_s)


def finish_campaign(campaign: CampaignRow, now: datetime, reason: str) -> None:
    """STOPPED: writers end their assignments after the attempt in hand, nothing new is assigned."""
    campaign.status, campaign.stopped_at, campaign.status_reason = STOPPED, now, reason
    log.info("campaign=%s stopped: %s", campaign.id, reason)


def idle(campaign: CampaignRow, reason: str) -> None:
    """A continuous campaign with nothing to assign stays RUNNING: a problem that joins it (a
    submitted one) or a writer that can do more (Settings.writer) gives it work again."""
    if campaign.status_reason != reason:
        campaign.status_reason = reason
        log.info("campaign=%s %s", campaign.id, reason)

"""Campaigns and round-robin assignment. The planner decides who works on what; it keeps, per
problem, the best attempt of the campaign (PASSED, highest speedup, then lowest latency)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy import func, select

from shared.db import AssignmentRow, AttemptRow, CampaignProblemRow, CampaignRow, Database, utcnow
from shared.errors import NotFoundError, UserError

log = logging.getLogger(__name__)

SendWrite = Callable[[int], None]


def create_campaign(db: Database, name: str, problem_ids: list[int], device: str, writers: int,
                    attempts_per_assignment: int) -> int:
    if not problem_ids:
        raise UserError("a campaign needs at least one problem")
    with db.session() as session:
        campaign = CampaignRow(name=name, device=device, writers=writers,
                               attempts_per_assignment=attempts_per_assignment, status="RUNNING")
        session.add(campaign)
        session.flush()
        for position, problem_id in enumerate(problem_ids):
            session.add(CampaignProblemRow(campaign_id=campaign.id, problem_id=problem_id, position=position))
        return campaign.id


def stop_campaign(db: Database, campaign_id: int) -> None:
    with db.session() as session:
        campaign = _campaign(session, campaign_id)
        if campaign.status == "RUNNING":
            campaign.status, campaign.stopped_at = "STOPPED", utcnow()


def tick(db: Database, campaign_id: int, send_write: SendWrite) -> list[int]:
    """Give every idle writer slot an assignment (round-robin over the campaign's problems)."""
    created = []
    with db.session() as session:
        campaign = _campaign(session, campaign_id)
        if campaign.status != "RUNNING":
            return []
        active = session.scalar(select(func.count()).select_from(AssignmentRow).where(
            AssignmentRow.campaign_id == campaign_id, AssignmentRow.status.in_(("QUEUED", "RUNNING"))))
        problems = session.scalars(select(CampaignProblemRow.problem_id).where(
            CampaignProblemRow.campaign_id == campaign_id).order_by(CampaignProblemRow.position)).all()
        for _ in range(max(0, campaign.writers - active)):
            problem_id = problems[campaign.next_index % len(problems)]
            campaign.next_index += 1
            assignment = AssignmentRow(campaign_id=campaign_id, problem_id=problem_id,
                                       budget_attempts=campaign.attempts_per_assignment, status="QUEUED")
            session.add(assignment)
            session.flush()
            created.append(assignment.id)
    for assignment_id in created:  # after the commit, so the writer finds the row
        send_write(assignment_id)
    log.info("campaign=%s new assignments=%s", campaign_id, created)
    return created


def assignment_done(db: Database, assignment_id: int, send_write: SendWrite) -> list[int]:
    with db.session() as session:
        assignment = session.get(AssignmentRow, assignment_id)
        if assignment is None:
            raise NotFoundError(f"no assignment {assignment_id}")
        if assignment.status != "DONE":
            assignment.status, assignment.finished_at = "DONE", utcnow()
        update_best(session, assignment.campaign_id, assignment.problem_id)
        campaign_id = assignment.campaign_id
    return tick(db, campaign_id, send_write)


def update_best(session, campaign_id: int, problem_id: int) -> str | None:
    best = session.scalars(select(AttemptRow.id).where(
        AttemptRow.campaign_id == campaign_id, AttemptRow.problem_id == problem_id,
        AttemptRow.status == "PASSED", AttemptRow.speedup.is_not(None),
    ).order_by(  # an unknown latency sorts last on every database (SQLite puts NULL first)
        AttemptRow.speedup.desc(), AttemptRow.latency_ms.is_(None), AttemptRow.latency_ms.asc(),
        func.coalesce(AttemptRow.finished_at, AttemptRow.created_at).asc(), AttemptRow.created_at.asc(),
        AttemptRow.id.asc(),  # the same order as the leaderboard's best
    ).limit(1)).first()
    row = session.get(CampaignProblemRow, (campaign_id, problem_id))
    row.best_attempt_id = best
    return best


def _campaign(session, campaign_id: int) -> CampaignRow:
    campaign = session.get(CampaignRow, campaign_id)
    if campaign is None:
        raise NotFoundError(f"no campaign {campaign_id}")
    return campaign

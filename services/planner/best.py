"""The campaign's best attempt per problem, recorded on `campaign_problems.best_attempt_id`."""

from __future__ import annotations

import logging
from collections.abc import Collection

from sqlalchemy import func, select, true
from sqlalchemy.orm import Session

from shared.db import AttemptRow, CampaignProblemRow
from shared.repository import VERDICT_KIND

log = logging.getLogger(__name__)


def best_order() -> tuple:
    """Best first: highest SOL score, highest speedup, lowest latency, earliest; missing figures
    sort last on every database. The leaderboard ranks the same way."""
    return (
        AttemptRow.sol_score.is_(None), AttemptRow.sol_score.desc(),
        AttemptRow.speedup.is_(None), AttemptRow.speedup.desc(),
        AttemptRow.latency_ms.is_(None), AttemptRow.latency_ms.asc(),
        func.coalesce(AttemptRow.finished_at, AttemptRow.created_at).asc(), AttemptRow.created_at.asc(),
        AttemptRow.id.asc(),
    )


def _rankable():
    """A PASSED evaluation with a figure (a diagnostic is never PASSED; the kind says so twice)."""
    return ((AttemptRow.status == "PASSED") & (AttemptRow.kind == VERDICT_KIND)
            & (AttemptRow.speedup.is_not(None) | AttemptRow.sol_score.is_not(None)))


def update_best(session: Session, campaign_id: int, problem_id: int) -> str | None:
    """The campaign's best PASSED attempt on the problem (`best_order`), recorded; None, and nothing
    recorded, when the problem is not in the campaign."""
    row = session.get(CampaignProblemRow, (campaign_id, problem_id))
    if row is None:
        log.warning("problem=%s is not in campaign=%s: no best recorded", problem_id, campaign_id)
        return None
    best = session.scalars(select(AttemptRow.id).where(
        AttemptRow.campaign_id == campaign_id, AttemptRow.problem_id == problem_id, _rankable(),
    ).order_by(*best_order()).limit(1)).first()
    if row.best_attempt_id != best:
        row.best_attempt_id = best
    return best


def update_bests(session: Session, campaign_id: int, only: Collection[int] | None = None) -> int:
    """Every problem's best (or those in `only`) in one statement; returns how many changed."""
    restrict = AttemptRow.problem_id.in_(list(only)) if only is not None else true()
    ranked = (select(AttemptRow.problem_id, AttemptRow.id,
                     func.row_number().over(partition_by=AttemptRow.problem_id, order_by=best_order()).label("rank"))
              .where(AttemptRow.campaign_id == campaign_id, _rankable(), restrict)).subquery()
    bests = dict(session.execute(select(ranked.c.problem_id, ranked.c.id).where(ranked.c.rank == 1)).all())
    query = select(CampaignProblemRow).where(CampaignProblemRow.campaign_id == campaign_id)
    if only is not None:
        query = query.where(CampaignProblemRow.problem_id.in_(list(only)))
    changed = [row for row in session.scalars(query) if row.best_attempt_id != bests.get(row.problem_id)]
    for row in changed:
        row.best_attempt_id = bests.get(row.problem_id)
    return len(changed)

"""Trimming a problem's notes (`shared/notes.py`) back under `notes_budget_chars`, on the planner's
tick: writers append between ticks, the planner decides what the next writer reads.

Which entries the file keeps (the DB keeps every entry, whatever happens here):
1. The newest entries, while together they take at most a third of the budget, stay in full: what
   the last writers found is what the next one most needs.
2. The others by support, best first; within a rank, newest first:
   - RECORD: linked to an attempt that PASSED and beat every PASSED attempt of the problem that
     finished before it (higher SOL score; speedup where it has none; the first to pass counts);
   - EVIDENCE: linked to any other attempt with a result: a verdict (PASSED, PARTIAL or a failure,
     whose message says why) or a diagnostic tool's output (`profile`, `inspect`);
   - UNSUPPORTED: no attempt, or one still waiting for its result.
   Each stays in full while it fits, else shortened to its first line while that fits, else it is
   dropped from the file.
3. The file lists what stays in the order it was written.
Only the entries the file shows now are weighed: a dropped entry does not come back.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from shared.db.models import AttemptRow, CampaignProblemRow, NoteRow, NotesFileRow
from shared.notes import DROPPED, FULL, SHORT, lock_problem, omitted_line, render_entry, rewrite_notes, \
    shown_entries, title
from shared.runtime import Runtime

log = logging.getLogger(__name__)

NEWEST_SHARE = 3  # the newest entries keep up to 1/NEWEST_SHARE of the budget in full
WAITING = ("PENDING", "RUNNING")


class Support(IntEnum):
    """How well an entry is backed by a result, best first."""

    RECORD = 0
    EVIDENCE = 1
    UNSUPPORTED = 2


@dataclass(frozen=True)
class Candidate:
    """An entry the file shows, with what it costs in the file in full and shortened."""

    id: int
    support: Support
    full_chars: int
    short_chars: int


def choose_shown(candidates: Sequence[Candidate], budget: int, overhead: int) -> dict[int, str]:
    """FULL, SHORT or DROPPED for each candidate (given oldest first), so that `overhead` plus the
    shown entries fit `budget` (the rule in the module docstring)."""
    left = budget - overhead
    shown = {c.id: DROPPED for c in candidates}
    newest_left = budget // NEWEST_SHARE
    for candidate in reversed(candidates):  # the newest, while they fit their share
        if candidate.full_chars > min(newest_left, left):
            break
        shown[candidate.id] = FULL
        newest_left, left = newest_left - candidate.full_chars, left - candidate.full_chars
    rest = [c for c in candidates if shown[c.id] == DROPPED]
    for candidate in sorted(rest, key=lambda c: (c.support, -c.id)):
        if candidate.full_chars <= left:
            shown[candidate.id], left = FULL, left - candidate.full_chars
        elif candidate.short_chars <= left:
            shown[candidate.id], left = SHORT, left - candidate.short_chars
    return shown


def trim_notes(runtime: Runtime, problem_id: int) -> bool:
    """Trim the problem's notes file if it is over the budget; True when it did."""
    budget = runtime.settings.notes_budget_chars
    with runtime.db.session() as session:
        problem = lock_problem(session, problem_id)
        row = session.get(NotesFileRow, problem_id)
        if row is None or row.chars <= budget:
            return False
        rows = shown_entries(session, problem_id)
        support = supports(session, problem_id, rows)
        candidates = [Candidate(r.id, support[r.id], len(render_entry(r, FULL)) + 1, len(render_entry(r, SHORT)) + 1)
                      for r in rows]
        overhead = len(title(problem.name)) + len(omitted_line(10**9, 10**9)) + 1
        shown = choose_shown(candidates, budget, overhead)
        if all(r.shown == shown[r.id] for r in rows):  # a budget too small for even the title: as it was
            return False
        for r in rows:
            r.shown = shown[r.id]
        before = row.chars
        row = rewrite_notes(session, runtime.store, problem, trimmed=True)
        log.info("problem=%s notes trimmed chars=%d->%d entries=%d", problem_id, before, row.chars, row.entries)
        return True


def trim_campaign_notes(runtime: Runtime, campaign_id: int) -> list[int]:
    """Trim the notes of the campaign's problems that are over the budget (one cheap query when
    none is); returns the problems trimmed."""
    with runtime.db.session() as session:
        over = list(session.scalars(
            select(NotesFileRow.problem_id)
            .join(CampaignProblemRow, CampaignProblemRow.problem_id == NotesFileRow.problem_id)
            .where(CampaignProblemRow.campaign_id == campaign_id,
                   NotesFileRow.chars > runtime.settings.notes_budget_chars)
            .order_by(NotesFileRow.problem_id)))
    return [problem_id for problem_id in over if trim_notes(runtime, problem_id)]


def supports(session: Session, problem_id: int, rows: Sequence[NoteRow]) -> dict[int, Support]:
    """Each entry's support, from the attempt it is linked to."""
    linked = {r.attempt_id for r in rows if r.attempt_id}
    attempts = {a.id: a for a in session.scalars(select(AttemptRow).where(AttemptRow.id.in_(linked)))} if linked else {}
    result = {}
    for row in rows:
        attempt = attempts.get(row.attempt_id) if row.attempt_id else None
        if attempt is None or (attempt.status in WAITING and attempt.finished_at is None):
            result[row.id] = Support.UNSUPPORTED
        elif _beat_the_best(session, problem_id, attempt):
            result[row.id] = Support.RECORD
        else:
            result[row.id] = Support.EVIDENCE
    return result


def _beat_the_best(session: Session, problem_id: int, attempt: AttemptRow) -> bool:
    """PASSED, and above every PASSED attempt of the problem that finished before it."""
    if attempt.status != "PASSED" or attempt.kind != "evaluate" or attempt.finished_at is None:
        return False
    metric = AttemptRow.sol_score if attempt.sol_score is not None else AttemptRow.speedup
    mine = attempt.sol_score if attempt.sol_score is not None else attempt.speedup
    if mine is None:
        return False
    before = session.scalar(select(func.max(metric)).where(
        AttemptRow.problem_id == problem_id, AttemptRow.status == "PASSED", AttemptRow.kind == "evaluate",
        AttemptRow.finished_at < attempt.finished_at, AttemptRow.id != attempt.id))
    return before is None or mine > before

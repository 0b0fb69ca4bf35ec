"""The leaderboard: one row a problem with its best PASSED attempt. Shared by the web app and the CLI.

Pure queries, no writes. Three statements whatever the number of problems and attempts: the problems
in scope, per-problem counts with the latest finished attempt, and the best PASSED attempt, the last
two ranked in SQL with window functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone

from pydantic import BaseModel, ConfigDict
from rich.table import Table
from sqlalchemy import Select, case, func, select
from sqlalchemy.orm import Session

from shared.db.models import AttemptRow, CampaignProblemRow, CampaignRow, ProblemRow, SolutionRow
from shared.errors import NotFoundError

IN_FLIGHT = ("PENDING", "RUNNING")
PASSED = "PASSED"
NO_ATTEMPTS = "NO_ATTEMPTS"


class LeaderboardEntry(BaseModel):
    """One problem. `speedup` is over the PyTorch reference (geomean over workloads) and, with
    `best_latency_ms`, `language` and `author`, comes from the best PASSED attempt; all are None
    when the problem has none. `status` is PASSED if any attempt passed, else the latest finished
    attempt's status, else NO_ATTEMPTS."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    op_type: str | None
    attempts: int  # finished attempts (in the campaign, when one is given)
    passed_attempts: int
    best_attempt_id: str | None
    best_latency_ms: float | None
    speedup: float | None
    language: str | None
    author: str | None
    status: str
    last_attempt_at: datetime | None  # UTC, when the latest finished attempt finished


class Leaderboard(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    generated_at: datetime  # UTC
    campaign_id: int | None
    problems: list[LeaderboardEntry]  # best speedup first; problems without a PASSED attempt last, by name


@dataclass(frozen=True)
class LeaderboardSummary:
    """The campaign-level figures: geomean speedup over the reference across solved problems, and
    the share of all problems beating the reference (> 1x) and above 2x."""

    problems: int
    solved: int
    geomean_speedup: float | None
    beating_reference: float
    above_2x: float


def leaderboard(session: Session, campaign_id: int | None = None) -> Leaderboard:
    """Every problem (or the campaign's problems, counting only the campaign's attempts)."""
    if campaign_id is not None and session.get(CampaignRow, campaign_id) is None:
        raise NotFoundError(f"no campaign {campaign_id}")
    generated_at = datetime.now(timezone.utc)
    problems = session.execute(_problems_query(campaign_id)).all()
    counts = {row.problem_id: row for row in session.execute(_latest_query(campaign_id))}
    bests = {row.problem_id: row for row in session.execute(_best_query(campaign_id))}
    entries = [_entry(problem, counts.get(problem.id), bests.get(problem.id)) for problem in problems]
    entries.sort(key=_sort_key)
    return Leaderboard(generated_at=generated_at, campaign_id=campaign_id, problems=entries)


def _problems_query(campaign_id: int | None) -> Select:
    query = select(ProblemRow.id, ProblemRow.name, ProblemRow.op_type)
    if campaign_id is not None:
        query = query.join(CampaignProblemRow, CampaignProblemRow.problem_id == ProblemRow.id).where(
            CampaignProblemRow.campaign_id == campaign_id
        )
    return query


def _finished_attempts(query: Select, campaign_id: int | None) -> Select:
    query = query.where(AttemptRow.status.not_in(IN_FLIGHT))
    if campaign_id is not None:
        query = query.where(AttemptRow.campaign_id == campaign_id)
    return query


def _finished_at():
    return func.coalesce(AttemptRow.finished_at, AttemptRow.created_at)


def _latest_query(campaign_id: int | None) -> Select:
    """Per problem: finished and PASSED counts, and the status and time of the latest finished attempt."""
    by_problem = {"partition_by": AttemptRow.problem_id}
    latest_first = (_finished_at().desc(), AttemptRow.created_at.desc(), AttemptRow.id.desc())
    ranked = _finished_attempts(
        select(
            AttemptRow.problem_id,
            AttemptRow.status,
            _finished_at().label("finished_at"),
            func.count().over(**by_problem).label("attempts"),
            func.sum(case((AttemptRow.status == PASSED, 1), else_=0)).over(**by_problem).label("passed"),
            func.row_number().over(**by_problem, order_by=latest_first).label("rank"),
        ),
        campaign_id,
    ).subquery()
    return select(ranked).where(ranked.c.rank == 1)


def _best_query(campaign_id: int | None) -> Select:
    """Per problem, the PASSED attempt with the highest speedup; ties go to the lower latency, then
    the earlier attempt. Missing figures sort last on every database (no NULLS LAST needed)."""
    best_first = (
        AttemptRow.speedup.is_(None), AttemptRow.speedup.desc(),
        AttemptRow.latency_ms.is_(None), AttemptRow.latency_ms.asc(),
        _finished_at().asc(), AttemptRow.created_at.asc(), AttemptRow.id.asc(),
    )
    ranked = _finished_attempts(
        select(
            AttemptRow.problem_id,
            AttemptRow.id,
            AttemptRow.latency_ms,
            AttemptRow.speedup,
            SolutionRow.language,
            SolutionRow.author,
            func.row_number().over(partition_by=AttemptRow.problem_id, order_by=best_first).label("rank"),
        )
        .join(SolutionRow, SolutionRow.hash == AttemptRow.solution_hash)
        .where(AttemptRow.status == PASSED),
        campaign_id,
    ).subquery()
    return select(ranked).where(ranked.c.rank == 1)


def _entry(problem, counts, best) -> LeaderboardEntry:
    status = PASSED if best is not None else counts.status if counts is not None else NO_ATTEMPTS
    return LeaderboardEntry(
        name=problem.name,
        op_type=problem.op_type,
        attempts=counts.attempts if counts is not None else 0,
        passed_attempts=int(counts.passed or 0) if counts is not None else 0,
        best_attempt_id=best.id if best is not None else None,
        best_latency_ms=best.latency_ms if best is not None else None,
        speedup=best.speedup if best is not None else None,
        language=best.language if best is not None else None,
        author=best.author if best is not None else None,
        status=status,
        last_attempt_at=_as_utc(counts.finished_at) if counts is not None else None,
    )


def _as_utc(moment: datetime | None) -> datetime | None:
    """The DB keeps naive UTC; the leaderboard says so."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=timezone.utc)


def _sort_key(entry: LeaderboardEntry) -> tuple:
    return (entry.best_attempt_id is None, entry.speedup is None, -(entry.speedup or 0.0), entry.name)


def summarize(board: Leaderboard) -> LeaderboardSummary:
    speedups = [e.speedup for e in board.problems if e.speedup is not None and e.speedup > 0]
    total = len(board.problems)
    geomean = math.exp(sum(math.log(s) for s in speedups) / len(speedups)) if speedups else None
    return LeaderboardSummary(
        problems=total,
        solved=sum(1 for e in board.problems if e.best_attempt_id is not None),
        geomean_speedup=geomean,
        beating_reference=sum(1 for s in speedups if s > 1.0) / total if total else 0.0,
        above_2x=sum(1 for s in speedups if s > 2.0) / total if total else 0.0,
    )


def render_table(board: Leaderboard) -> Table:
    """The leaderboard for a terminal (rich)."""
    title = "Leaderboard" if board.campaign_id is None else f"Leaderboard, campaign {board.campaign_id}"
    table = Table(title=title)
    table.add_column("#", justify="right")
    table.add_column("problem")
    table.add_column("op")
    table.add_column("best ms", justify="right")
    table.add_column("speedup", justify="right")
    table.add_column("status")
    table.add_column("passed/attempts", justify="right")
    table.add_column("language")
    table.add_column("author")
    for rank, entry in enumerate(board.problems, start=1):
        table.add_row(
            str(rank),
            entry.name,
            entry.op_type or "",
            _format(entry.best_latency_ms, "{:.4f}"),
            _format(entry.speedup, "{:.2f}x"),
            _styled_status(entry.status),
            f"{entry.passed_attempts}/{entry.attempts}",
            entry.language or "",
            entry.author or "",
        )
    return table


def _format(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def _styled_status(status: str) -> str:
    if status == PASSED:
        return f"[green]{status}[/green]"
    if status == NO_ATTEMPTS:
        return f"[dim]{status}[/dim]"
    return f"[red]{status}[/red]"

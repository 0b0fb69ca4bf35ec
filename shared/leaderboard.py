"""The leaderboard: one row a problem with its best PASSED attempt. Shared by the web app and the CLI.

Pure queries, no writes. Five statements whatever the number of problems and attempts: the problems
in scope, their definitions (for the source model), per-problem counts and costs with the latest
finished attempt, the best PASSED attempt (the last two ranked in SQL with window functions), and the
best attempts' per-workload baselines. `problem_figures` computes any subset of the problems, and
`status_counts` tells cheaply which problems changed: the web app keeps figures between requests
with them (services/web/leaderboard_cache.py).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from datetime import datetime, timezone

from pydantic import BaseModel, ConfigDict
from rich.table import Table
from sqlalchemy import Select, case, func, select
from sqlalchemy.orm import Session

from shared.db.models import AttemptRow, CampaignProblemRow, CampaignRow, ProblemRow, SolutionRow, TraceRow
from shared.errors import NotFoundError
from shared.repository import REFERENCE_AUTHOR, VERDICT_KIND

IN_FLIGHT = ("PENDING", "RUNNING")
PASSED = "PASSED"
NO_ATTEMPTS = "NO_ATTEMPTS"
MAX_IDS_PER_QUERY = 2000  # more problems than this are read whole, not listed in an IN clause


class LeaderboardEntry(BaseModel):
    """One problem. The best attempt is the PASSED one with the highest SOL score, then the highest
    speedup, then the lowest latency, then the earliest. `best_*`, `sol_score`, both speedups,
    `language`, `author`, `model` and `last_improvement_at` describe it and are None when the problem
    has no PASSED attempt (`sol_score` and `speedup_over_baseline` also while the SOL model has not
    scored it). `status` is PASSED if any attempt passed, else the latest finished attempt's status,
    else NO_ATTEMPTS. `solved` only when a solution other than the problem's reference passed (the
    reference's own PASSED check, on submission, solves nothing)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    op_type: str | None
    source_model: str | None  # the definition's hf_id: the model the problem was cut from
    attempts: int  # finished attempts (in the campaign, when one is given)
    passed_attempts: int
    solved: bool  # an attempt of a solution other than the reference (author `reference`) PASSED
    tokens: int  # spent on the finished attempts
    gpu_seconds: float
    best_attempt_id: str | None
    best_latency_ms: float | None
    sol_score: float | None  # 0.5 at the baseline T_b, 1.0 at the hardware limit
    speedup: float | None  # over the eager PyTorch reference, geomean over workloads
    speedup_over_baseline: float | None  # over T_b (best of eager and torch.compile), geomean
    best_workloads: int | None  # the workloads the best attempt passed: what its geomeans are over
    language: str | None
    author: str | None
    model: str | None  # the LLM that wrote the best solution, if one did
    status: str
    last_attempt_at: datetime | None  # UTC, when the latest finished attempt finished
    last_improvement_at: datetime | None  # UTC, when the best attempt finished


class LeaderboardSummary(BaseModel):
    """The figures a campaign is judged by. Shares are over all problems in scope; the geomeans
    and the median over the problems that have the figure (None when none has)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    problems: int
    solved: int  # problems with `solved` entries: a solution other than the reference PASSED
    geomean_speedup_over_baseline: float | None
    # Shares of the problems in scope faster than T_b, more than 2x; None while no problem has a T_b
    # (no baseline measured, on a CPU say): "0%" would say they were all slower.
    beating_baseline: float | None
    above_2x_baseline: float | None
    baseline_problems: int  # problems with a speedup over T_b: the count behind its geomean
    speedup_problems: int  # problems with a speedup over the reference: the count behind its geomean
    median_sol_score: float | None
    geomean_speedup: float | None  # over the eager reference
    beating_reference: float
    above_2x: float
    attempts: int
    gpu_hours: float
    tokens: int


class Leaderboard(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    generated_at: datetime  # UTC
    campaign_id: int | None
    summary: LeaderboardSummary
    problems: list[LeaderboardEntry]  # best first; problems without a PASSED attempt last, by name


@dataclass(frozen=True)
class ProblemFigures:
    """One problem's figures, everything of its entry but its name and op type."""

    source_model: str | None
    attempts: int
    passed_attempts: int
    solved: bool
    tokens: int
    gpu_seconds: float
    best_attempt_id: str | None
    best_latency_ms: float | None
    sol_score: float | None
    speedup: float | None
    speedup_over_baseline: float | None
    best_workloads: int | None
    language: str | None
    author: str | None
    model: str | None
    status: str
    last_attempt_at: datetime | None
    last_improvement_at: datetime | None


def leaderboard(session: Session, campaign_id: int | None = None) -> Leaderboard:
    """Every problem (or the campaign's problems, counting only the campaign's attempts)."""
    check_campaign(session, campaign_id)
    generated_at = datetime.now(timezone.utc)
    problems = problems_in_scope(session, campaign_id)
    return assemble(generated_at, campaign_id, problems, problem_figures(session, campaign_id))


def check_campaign(session: Session, campaign_id: int | None) -> None:
    if campaign_id is not None and session.get(CampaignRow, campaign_id) is None:
        raise NotFoundError(f"no campaign {campaign_id}")


def problems_in_scope(session: Session, campaign_id: int | None) -> list:
    """(id, name, op_type) of every problem, or of the campaign's."""
    query = select(ProblemRow.id, ProblemRow.name, ProblemRow.op_type)
    if campaign_id is not None:
        query = query.join(CampaignProblemRow, CampaignProblemRow.problem_id == ProblemRow.id).where(
            CampaignProblemRow.campaign_id == campaign_id
        )
    return list(session.execute(query))


def problem_figures(session: Session, campaign_id: int | None,
                    problem_ids: list[int] | None = None) -> dict[int, ProblemFigures]:
    """Figures of the given problems (all when None), in four statements whatever their number."""
    restrict = None if problem_ids is None or len(problem_ids) > MAX_IDS_PER_QUERY else problem_ids
    definitions = select(ProblemRow.id, ProblemRow.definition_json)
    if restrict is not None:
        definitions = definitions.where(ProblemRow.id.in_(restrict))
    models = {row.id: _source_model(row.definition_json) for row in session.execute(definitions)}
    counts = {row.problem_id: row for row in session.execute(_latest_query(campaign_id, restrict))}
    bests = {row.problem_id: row for row in session.execute(_best_query(campaign_id, restrict))}
    over_baseline = _speedups_over_baseline(session, [best.id for best in bests.values()])
    wanted = models.keys() if problem_ids is None else problem_ids
    return {pid: _figures(models.get(pid), counts.get(pid), bests.get(pid), over_baseline) for pid in wanted}


def status_counts(session: Session, campaign_id: int | None,
                  problem_ids: list[int] | None = None) -> dict[int, tuple[tuple[str, int], ...]]:
    """Per problem, its finished attempts counted by status: one read of the (problem_id, status)
    index. Every attempt that finishes changes it (the evaluator writes status and figures together);
    attempts in flight count for nothing on the leaderboard, so they are left out, and so are a
    writer's diagnostics (profile, inspect: no verdict)."""
    query = select(AttemptRow.problem_id, AttemptRow.status, func.count()).where(
        AttemptRow.status.not_in(IN_FLIGHT), AttemptRow.kind == VERDICT_KIND)
    if campaign_id is not None:
        query = query.where(AttemptRow.campaign_id == campaign_id)
    if problem_ids is not None:
        query = query.where(AttemptRow.problem_id.in_(problem_ids))
    counts: dict[int, list[tuple[str, int]]] = {}
    for problem_id, status, count in session.execute(query.group_by(AttemptRow.problem_id, AttemptRow.status)):
        counts.setdefault(problem_id, []).append((status, count))
    return {problem_id: tuple(sorted(pairs)) for problem_id, pairs in counts.items()}


def last_trace_id(session: Session) -> int:
    """The newest traces row (a primary-key lookup): the evaluator writes an attempt's traces in the
    transaction that finishes it."""
    return session.scalar(select(func.max(TraceRow.id))) or 0


def problems_with_traces_after(session: Session, trace_id: int, campaign_id: int | None) -> set[int]:
    """Problems with attempts whose traces rows came after `trace_id` (a primary-key range)."""
    query = (select(AttemptRow.problem_id).join(TraceRow, TraceRow.attempt_id == AttemptRow.id)
             .where(TraceRow.id > trace_id).distinct())
    if campaign_id is not None:
        query = query.where(AttemptRow.campaign_id == campaign_id)
    return set(session.scalars(query))


def assemble(generated_at: datetime, campaign_id: int | None, problems: list,
             figures: dict[int, ProblemFigures]) -> Leaderboard:
    return assemble_entries(generated_at, campaign_id, [entry(p, figures[p.id]) for p in problems])


def entry(problem, figures: ProblemFigures | LeaderboardEntry) -> LeaderboardEntry:
    """The entry of `problem` (id, name, op_type) with the figures of a ProblemFigures or an entry."""
    values = {name: getattr(figures, name) for name in ProblemFigures.__dataclass_fields__}
    return LeaderboardEntry(name=problem.name, op_type=problem.op_type, **values)


def assemble_entries(generated_at: datetime, campaign_id: int | None,
                     entries: list[LeaderboardEntry]) -> Leaderboard:
    entries = sorted(entries, key=_sort_key)
    return Leaderboard.model_construct(generated_at=generated_at, campaign_id=campaign_id,
                                       summary=summarize(entries), problems=entries)


def _finished_attempts(query: Select, campaign_id: int | None, problem_ids: list[int] | None) -> Select:
    query = query.where(AttemptRow.status.not_in(IN_FLIGHT))
    if campaign_id is not None:
        query = query.where(AttemptRow.campaign_id == campaign_id)
    if problem_ids is not None:
        query = query.where(AttemptRow.problem_id.in_(problem_ids))
    return query


def _finished_at():
    return func.coalesce(AttemptRow.finished_at, AttemptRow.created_at)


def _latest_query(campaign_id: int | None, problem_ids: list[int] | None) -> Select:
    """Per problem: finished and PASSED counts (all, and those of solutions other than the
    reference), tokens and GPU seconds, and the status and time of the latest finished attempt.
    The counts and the latest status are the evaluations' (a diagnostic's is no verdict: it ranks
    last); tokens and GPU seconds are every attempt's, diagnostics' too."""
    by_problem = {"partition_by": AttemptRow.problem_id}
    verdict = AttemptRow.kind == VERDICT_KIND
    latest_first = (case((verdict, 0), else_=1), _finished_at().desc(), AttemptRow.created_at.desc(),
                    AttemptRow.id.desc())
    passed = verdict & (AttemptRow.status == PASSED)
    ranked = _finished_attempts(
        select(
            AttemptRow.problem_id,
            AttemptRow.status,
            _finished_at().label("finished_at"),
            func.sum(case((verdict, 1), else_=0)).over(**by_problem).label("attempts"),
            func.sum(case((passed, 1), else_=0)).over(**by_problem).label("passed"),
            func.sum(case((passed & (SolutionRow.author != REFERENCE_AUTHOR), 1), else_=0))
            .over(**by_problem).label("passed_not_reference"),
            func.sum(AttemptRow.tokens).over(**by_problem).label("tokens"),
            func.sum(AttemptRow.gpu_seconds).over(**by_problem).label("gpu_seconds"),
            func.row_number().over(**by_problem, order_by=latest_first).label("rank"),
        )
        .join(SolutionRow, SolutionRow.hash == AttemptRow.solution_hash),
        campaign_id, problem_ids,
    ).subquery()
    return select(ranked).where(ranked.c.rank == 1)


def best_order() -> tuple:
    """Best first: highest SOL score, highest speedup, lowest latency, earliest. Missing figures sort
    last on every database (no NULLS LAST needed)."""
    return (
        AttemptRow.sol_score.is_(None), AttemptRow.sol_score.desc(),
        AttemptRow.speedup.is_(None), AttemptRow.speedup.desc(),
        AttemptRow.latency_ms.is_(None), AttemptRow.latency_ms.asc(),
        _finished_at().asc(), AttemptRow.created_at.asc(), AttemptRow.id.asc(),
    )


def _best_query(campaign_id: int | None, problem_ids: list[int] | None) -> Select:
    """Per problem, the best PASSED attempt (`best_order`)."""
    ranked = _finished_attempts(
        select(
            AttemptRow.problem_id,
            AttemptRow.id,
            AttemptRow.latency_ms,
            AttemptRow.speedup,
            AttemptRow.sol_score,
            AttemptRow.model,
            AttemptRow.workloads_passed,
            _finished_at().label("finished_at"),
            SolutionRow.language,
            SolutionRow.author,
            func.row_number().over(partition_by=AttemptRow.problem_id, order_by=best_order()).label("rank"),
        )
        .join(SolutionRow, SolutionRow.hash == AttemptRow.solution_hash)
        .where(AttemptRow.status == PASSED, AttemptRow.kind == VERDICT_KIND),
        campaign_id, problem_ids,
    ).subquery()
    return select(ranked).where(ranked.c.rank == 1)


def _speedups_over_baseline(session: Session, attempt_ids: list[str]) -> dict[str, float]:
    """Per attempt, the geomean over its workloads of T_b / latency (workloads with both figures)."""
    if not attempt_ids:
        return {}
    rows = session.execute(
        select(TraceRow.attempt_id, TraceRow.t_baseline_ms, TraceRow.latency_ms).where(
            TraceRow.attempt_id.in_(attempt_ids), TraceRow.t_baseline_ms > 0, TraceRow.latency_ms > 0)
    )
    ratios: dict[str, list[float]] = {}
    for row in rows:
        ratios.setdefault(row.attempt_id, []).append(row.t_baseline_ms / row.latency_ms)
    return {attempt_id: geomean(values) for attempt_id, values in ratios.items()}


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _source_model(definition_json: str) -> str | None:
    try:
        hf_id = json.loads(definition_json).get("hf_id")
    except (ValueError, AttributeError):  # a hand-written row that is not a JSON object
        return None
    return hf_id or None


def _figures(source_model: str | None, counts, best, over_baseline: dict[str, float]) -> ProblemFigures:
    evaluated = counts is not None and bool(counts.attempts)  # else diagnostics only, or nothing
    status = PASSED if best is not None else counts.status if evaluated else NO_ATTEMPTS
    return ProblemFigures(
        source_model=source_model,
        attempts=int(counts.attempts or 0) if counts is not None else 0,
        passed_attempts=int(counts.passed or 0) if counts is not None else 0,
        solved=bool(counts.passed_not_reference) if counts is not None else False,
        tokens=int(counts.tokens or 0) if counts is not None else 0,
        gpu_seconds=float(counts.gpu_seconds or 0.0) if counts is not None else 0.0,
        best_attempt_id=best.id if best is not None else None,
        best_latency_ms=best.latency_ms if best is not None else None,
        sol_score=best.sol_score if best is not None else None,
        speedup=best.speedup if best is not None else None,
        speedup_over_baseline=over_baseline.get(best.id) if best is not None else None,
        best_workloads=best.workloads_passed if best is not None else None,
        language=best.language if best is not None else None,
        author=best.author if best is not None else None,
        model=best.model if best is not None else None,
        status=status,
        last_attempt_at=as_utc(counts.finished_at) if evaluated else None,
        last_improvement_at=as_utc(best.finished_at) if best is not None else None,
    )


def as_utc(moment: datetime | None) -> datetime | None:
    """The DB keeps naive UTC; the leaderboard says so."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=timezone.utc)


def _sort_key(entry: LeaderboardEntry) -> tuple:
    return (entry.best_attempt_id is None, entry.sol_score is None, -(entry.sol_score or 0.0),
            entry.speedup is None, -(entry.speedup or 0.0), entry.name)


def summarize(entries: list[LeaderboardEntry]) -> LeaderboardSummary:
    total = len(entries)
    over_baseline = [e.speedup_over_baseline for e in entries if e.speedup_over_baseline]
    over_reference = [e.speedup for e in entries if e.speedup is not None and e.speedup > 0]
    scores = [e.sol_score for e in entries if e.sol_score is not None]

    def share(values: list[float], above: float) -> float:
        return sum(1 for v in values if v > above) / total if total else 0.0

    return LeaderboardSummary(
        problems=total,
        solved=sum(1 for e in entries if e.solved),
        geomean_speedup_over_baseline=geomean(over_baseline) if over_baseline else None,
        beating_baseline=share(over_baseline, 1.0) if over_baseline else None,
        above_2x_baseline=share(over_baseline, 2.0) if over_baseline else None,
        baseline_problems=len(over_baseline),
        speedup_problems=len(over_reference),
        median_sol_score=statistics.median(scores) if scores else None,
        geomean_speedup=geomean(over_reference) if over_reference else None,
        beating_reference=share(over_reference, 1.0),
        above_2x=share(over_reference, 2.0),
        attempts=sum(e.attempts for e in entries),
        gpu_hours=sum(e.gpu_seconds for e in entries) / 3600.0,
        tokens=sum(e.tokens for e in entries),
    )


def render_table(board: Leaderboard, width: int = 200) -> Table:
    """The leaderboard for a terminal (rich). Below 120 columns the op, latency, language, model and
    author are left out (`--json` has everything); the speedups carry the workload count behind them."""
    title = "Leaderboard" if board.campaign_id is None else f"Leaderboard, campaign {board.campaign_id}"
    summary = board.summary
    if summary.geomean_speedup is not None:
        title += f": geomean {summary.geomean_speedup:.2f}x over {summary.speedup_problems} of {summary.problems} problems"
    wide = width >= 120
    table = Table(title=title)
    columns = [("#", "right"), ("problem", "left"), *([("op", "left")] if wide else []), ("SOL", "right"),
               *([("best ms", "right")] if wide else []), ("vs T_b", "right"), ("speedup", "right"),
               ("status", "left"), ("passed/att.", "right"),
               *([("language", "left"), ("model", "left"), ("author", "left")] if wide else [])]
    for name, justify in columns:
        table.add_column(name, justify=justify, overflow="fold")
    for rank, entry in enumerate(board.problems, start=1):
        over = f" ({entry.best_workloads} w)" if entry.best_workloads and not wide else \
            f" over {entry.best_workloads}" if entry.best_workloads else ""
        cells = {"#": str(rank), "problem": entry.name, "op": entry.op_type or "",
                 "SOL": _format(entry.sol_score, "{:.3f}"), "best ms": _format(entry.best_latency_ms, "{:.4f}"),
                 "vs T_b": _format(entry.speedup_over_baseline, "{:.2f}x"),
                 "speedup": _format(entry.speedup, "{:.2f}x") + (over if entry.speedup is not None else ""),
                 "status": _styled_status(entry.status), "passed/att.": f"{entry.passed_attempts}/{entry.attempts}",
                 "language": entry.language or "", "model": entry.model or "—", "author": entry.author or ""}
        table.add_row(*(cells[name] for name, _ in columns))
    return table


def _format(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def _styled_status(status: str) -> str:
    if status == PASSED:
        return f"[green]{status}[/green]"
    if status == NO_ATTEMPTS:
        return f"[dim]{status}[/dim]"
    return f"[red]{status}[/red]"

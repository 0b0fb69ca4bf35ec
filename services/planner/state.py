"""A campaign's state as the policy sees it, read from the DB, the system of record.

Per problem, the finished attempts (NOT_EVALUATED ones aside: the evaluators' faults, no verdict)
are folded in SQL with window functions (gains, stall, costs, best), whatever their number; the active assignments and the attempts recorded are read fresh at
every tick. At 10,000 problems the per-problem fold is the expensive part, so the planner process
keeps it in a `StateCache`: refreshed for the problems whose assignments closed since the last
tick, and in full every `full_every_s` (a verdict that arrives after its writer stopped waiting is
seen then). The cache is derived data: a restarted planner rebuilds it from the DB.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace

from sqlalchemy import and_, case, func, select, true
from sqlalchemy.orm import Session

from services.planner.best import best_order
from services.planner.brief import RECENT, Candidate, Recent
from services.planner.policy import BASELINE_SCORE, MAX_ESTIMATE, PolicyConfig, ProblemStats
from shared.db import AssignmentRow, AttemptRow, CampaignProblemRow, SolutionRow
from shared.repository import IN_FLIGHT, NOT_EVALUATED, PARTIAL, VERDICT_KIND

ACTIVE = ("QUEUED", "RUNNING")
PASSED = "PASSED"
INVALID_REFERENCE = "INVALID_REFERENCE"
PARENT_CANDIDATES = 20


@dataclass(frozen=True)
class Active:
    """An assignment holding a writer slot; `made` attempts recorded, `finished` of them done."""

    assignment_id: int
    problem_id: int
    budget: int
    made: int
    finished: int


@dataclass(frozen=True)
class Spent:
    attempts: int  # recorded, finished or not (when counted)
    gpu_s: float  # of finished attempts
    tokens: int


@dataclass(frozen=True)
class CampaignState:
    problems: tuple[ProblemStats, ...]
    active: tuple[Active, ...]
    spent: Spent
    refreshed: frozenset[int] | None = None  # the problems read again from a cache (None: all)


@dataclass
class _Entry:
    stats: dict[int, ProblemStats]
    refreshed_at: float
    active: dict[int, int] = field(default_factory=dict)  # assignment -> problem, after the last tick
    closed: set[int] = field(default_factory=set)  # assignments the ticks saw close since the refresh...
    closed_before: set[int] = field(default_factory=set)  # ...and in the period before it
    dirty: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class Refresh:
    """What `StateCache.problems` read: the stats, and the problems read again (None: all)."""

    stats: dict[int, ProblemStats]
    problems: frozenset[int] | None


class StateCache:
    """The per-problem fold of each campaign, kept between ticks by one planner process (whose
    ticks and reports run one at a time)."""

    def __init__(self, full_every_s: float = 60.0) -> None:
        self.full_every_s = full_every_s
        self._entries: dict[int, _Entry] = {}

    def problems(self, session: Session, campaign_id: int, config: PolicyConfig, active: Sequence[Active]) -> Refresh:
        """The fold, refreshed in full when missing or old, else for the problems marked and those
        of the assignments that closed since the last tick."""
        entry = self._entries.get(campaign_id)
        if entry is None or time.monotonic() - entry.refreshed_at > self.full_every_s:
            stats = problem_stats(session, campaign_id, config)
            if entry is None:
                self._entries[campaign_id] = _Entry(stats, time.monotonic())
            else:  # the active assignments and the recently closed ones carry over
                entry.stats, entry.refreshed_at, entry.dirty = stats, time.monotonic(), set()
                entry.closed_before, entry.closed = entry.closed, set()
            return Refresh(stats, None)
        still_active = {a.assignment_id for a in active}
        entry.dirty.update(p for a, p in entry.active.items() if a not in still_active)
        dirty = frozenset(entry.dirty)
        if dirty:
            entry.stats.update(problem_stats(session, campaign_id, config, dirty))
            entry.dirty.clear()
        return Refresh(entry.stats, dirty)

    def remember_active(self, campaign_id: int, active: dict[int, int]) -> None:
        """The assignments active once a tick committed; the ones gone since the last are closed."""
        entry = self._entries.get(campaign_id)
        if entry is not None:
            entry.closed.update(a for a in entry.active if a not in active)
            entry.active = dict(active)

    def seen_closed(self, assignment_id: int) -> bool:
        """A tick already counted its slot free: a report of it changes nothing."""
        return any(assignment_id in entry.closed or assignment_id in entry.closed_before
                   for entry in self._entries.values())

    def counted_free(self, campaign_id: int, assignment_id: int) -> bool:
        """The campaign's last tick ran in this process and the assignment was not active after it:
        its slot was free then (or it is not this campaign's)."""
        entry = self._entries.get(campaign_id)
        return entry is not None and assignment_id not in entry.active

    def active_problem(self, assignment_id: int) -> tuple[int, int] | None:
        """(campaign, problem) of an assignment active at its campaign's last tick."""
        for campaign_id, entry in self._entries.items():
            if assignment_id in entry.active:
                return campaign_id, entry.active[assignment_id]
        return None

    def mark(self, campaign_id: int, problem_id: int) -> None:
        if campaign_id in self._entries:
            self._entries[campaign_id].dirty.add(problem_id)


def read_state(session: Session, campaign_id: int, config: PolicyConfig, cache: StateCache | None = None,
               count_recorded: bool = True, count_unattributed: bool = True) -> CampaignState:
    """`count_recorded`: count every attempt recorded (the attempt budget needs it; 0 otherwise).
    `count_unattributed`: add the assignments' tokens that no attempt carries (the token budget
    needs them; a sum over the campaign's assignments, left out of a tick that has no such budget)."""
    active = active_assignments(session, campaign_id)
    refresh = (cache.problems(session, campaign_id, config, active) if cache is not None
               else Refresh(problem_stats(session, campaign_id, config), None))
    stats = refresh.stats
    in_flight: dict[int, int] = {}
    for a in active:
        in_flight[a.problem_id] = in_flight.get(a.problem_id, 0) + max(0, a.budget - a.finished)
    problems = tuple(replace(s, in_flight=in_flight[p]) if p in in_flight else s for p, s in stats.items())
    recorded = session.scalar(select(func.count()).select_from(AttemptRow).where(
        AttemptRow.campaign_id == campaign_id)) if count_recorded else 0
    unattributed = session.scalar(select(func.coalesce(func.sum(AssignmentRow.tokens), 0)).where(
        AssignmentRow.campaign_id == campaign_id)) if count_unattributed else 0  # LLM turns without an attempt
    spent = Spent(recorded, sum(s.gpu_s for s in problems), sum(s.tokens for s in problems) + int(unattributed or 0))
    return CampaignState(problems, tuple(active), spent, refresh.problems)


def problem_stats(session: Session, campaign_id: int, config: PolicyConfig,
                  only: Collection[int] | None = None) -> dict[int, ProblemStats]:
    """Per problem of the campaign (or of `only`), what its finished attempts and closed
    assignments say; `in_flight` is left at 0."""
    restrict = (lambda column: column.in_(list(only))) if only is not None else (lambda column: true())
    positions = dict(session.execute(select(CampaignProblemRow.problem_id, CampaignProblemRow.position).where(
        CampaignProblemRow.campaign_id == campaign_id, restrict(CampaignProblemRow.problem_id))).all())
    finished = {row.problem_id: row for row in session.execute(_finished_query(campaign_id, config, restrict))}
    last_attempted = dict(session.execute(
        select(AttemptRow.problem_id, func.max(AttemptRow.assignment_id))
        .where(AttemptRow.campaign_id == campaign_id, restrict(AttemptRow.problem_id))
        .group_by(AttemptRow.problem_id)).all())
    same_writer = true() if config.writer is None else \
        func.coalesce(AssignmentRow.writer, "tuner") == config.writer  # rows from before writers were recorded
    last_done = dict(session.execute(
        select(AssignmentRow.problem_id, func.max(AssignmentRow.id))
        .where(AssignmentRow.campaign_id == campaign_id, AssignmentRow.status == "DONE",
               restrict(AssignmentRow.problem_id), same_writer)
        .group_by(AssignmentRow.problem_id)).all())
    stats = {}
    for problem_id, position in positions.items():
        attempted = last_attempted.get(problem_id)
        exhausted = problem_id in last_done and (attempted is None or last_done[problem_id] > attempted)
        stats[problem_id] = _stats(problem_id, position, finished.get(problem_id), config, exhausted)
    return stats


def _stats(problem_id: int, position: int, row, config: PolicyConfig, exhausted: bool) -> ProblemStats:
    if row is None:
        return ProblemStats(problem_id, position, exhausted=exhausted)
    return ProblemStats(
        problem_id, position, attempts=row.attempts, recent_attempts=min(row.attempts, config.window),
        recent_gain=float(row.recent_gain or 0.0), gain=float(row.gain or 0.0),
        stall=row.attempts - (row.last_gain_seq or 0), failures=int(row.failures or 0),
        invalid_references=int(row.invalid_references or 0),
        best_speedup=row.best_speedup, best_sol=row.best_sol, gpu_s=float(row.gpu_s or 0.0),
        tokens=int(row.tokens or 0), exhausted=exhausted)


def _merit(config: PolicyConfig):
    """`policy.merit` in SQL: the measured SOL score, else the estimate from the speedup."""
    inverse = 1.0 / config.assumed_sol_speedup
    estimate = 1.0 / (1.0 + (1.0 / AttemptRow.speedup - inverse) / (1.0 - inverse))
    return case(
        (AttemptRow.status != PASSED, None),
        (AttemptRow.kind != VERDICT_KIND, None),  # a diagnostic's row: no merit, whatever it says
        (AttemptRow.sol_score.is_not(None), AttemptRow.sol_score),
        (AttemptRow.speedup.is_(None) | (AttemptRow.speedup <= 0), None),
        (AttemptRow.speedup >= config.assumed_sol_speedup, MAX_ESTIMATE),
        (estimate > MAX_ESTIMATE, MAX_ESTIMATE),
        else_=estimate)


def _finished_query(campaign_id: int, config: PolicyConfig, restrict):
    """One row a problem. Four levels, each computing its expression once: merit per attempt; the
    best before it and its place in finish order; its gain; the sums. A writer's diagnostic
    (profile, inspect) is no verdict: no merit, no place in the order, no attempt or failure;
    its GPU seconds and tokens count."""
    rows = (select(AttemptRow.problem_id, AttemptRow.id, AttemptRow.status, AttemptRow.gpu_seconds,
                   (AttemptRow.kind == VERDICT_KIND).label("verdict"),
                   AttemptRow.tokens, AttemptRow.speedup, AttemptRow.sol_score, _merit(config).label("merit"),
                   func.coalesce(AttemptRow.finished_at, AttemptRow.created_at).label("finished_at"))
            .where(AttemptRow.campaign_id == campaign_id, AttemptRow.status.not_in((*IN_FLIGHT, NOT_EVALUATED)),
                   restrict(AttemptRow.problem_id))).subquery()
    by_problem = {"partition_by": rows.c.problem_id, "order_by": (rows.c.finished_at, rows.c.id)}
    ordered = select(
        rows.c.problem_id, rows.c.status, rows.c.gpu_seconds, rows.c.tokens, rows.c.speedup, rows.c.sol_score,
        rows.c.verdict, rows.c.merit, func.max(rows.c.merit).over(**by_problem, rows=(None, -1)).label("prior_best"),
        func.sum(case((rows.c.verdict, 1), else_=0)).over(**by_problem, rows=(None, 0)).label("seq"),
        func.sum(case((rows.c.verdict, 1), else_=0)).over(partition_by=rows.c.problem_id).label("total")).subquery()
    before = func.coalesce(ordered.c.prior_best, BASELINE_SCORE)
    gained = select(ordered, case(
        (and_(ordered.c.merit.is_not(None), ordered.c.merit > before, before < 1.0),
         (ordered.c.merit - before) / (1.0 - before)), else_=0.0).label("gain")).subquery()
    verdict = gained.c.verdict
    passed = verdict & (gained.c.status == PASSED)
    return select(
        gained.c.problem_id,
        func.sum(case((verdict, 1), else_=0)).label("attempts"),
        func.sum(case((verdict & gained.c.status.not_in((PASSED, PARTIAL)), 1), else_=0)).label("failures"),
        func.sum(case((verdict & (gained.c.status == INVALID_REFERENCE), 1), else_=0)).label("invalid_references"),
        func.sum(gained.c.gain).label("gain"),
        func.sum(case((gained.c.seq > gained.c.total - config.window, gained.c.gain), else_=0.0)).label("recent_gain"),
        func.max(case((gained.c.gain >= config.min_gain, gained.c.seq))).label("last_gain_seq"),
        func.sum(gained.c.gpu_seconds).label("gpu_s"),
        func.sum(gained.c.tokens).label("tokens"),
        func.max(case((passed, gained.c.speedup))).label("best_speedup"),
        func.max(case((passed, gained.c.sol_score))).label("best_sol"),
    ).group_by(gained.c.problem_id)


def active_assignments(session: Session, campaign_id: int) -> list[Active]:
    rows = session.execute(select(AssignmentRow.id, AssignmentRow.problem_id, AssignmentRow.budget_attempts)
                           .where(AssignmentRow.campaign_id == campaign_id, AssignmentRow.status.in_(ACTIVE))).all()
    if not rows:
        return []
    counts = {r.assignment_id: r for r in session.execute(
        select(AttemptRow.assignment_id, func.count().label("made"),
               func.sum(case((AttemptRow.status.in_(IN_FLIGHT), 0), else_=1)).label("finished"))
        .where(AttemptRow.campaign_id == campaign_id, AttemptRow.problem_id.in_({r.problem_id for r in rows}),
               AttemptRow.assignment_id.in_([r.id for r in rows]))
        .group_by(AttemptRow.assignment_id))}
    return [Active(r.id, r.problem_id, r.budget_attempts, counts[r.id].made if r.id in counts else 0,
                   int(counts[r.id].finished or 0) if r.id in counts else 0) for r in rows]


def count_active(session: Session, campaign_id: int) -> int:
    return session.scalar(select(func.count()).select_from(AssignmentRow).where(
        AssignmentRow.campaign_id == campaign_id, AssignmentRow.status.in_(ACTIVE)))


def parent_candidates(session: Session, campaign_id: int, problem_ids: Sequence[int]) -> dict[int, list[Candidate]]:
    """Per problem, its best PASSED solutions of the campaign, best first (one row a solution)."""
    ranked = (select(
        AttemptRow.problem_id, AttemptRow.solution_hash, SolutionRow.language, SolutionRow.parent_hash,
        func.row_number().over(partition_by=AttemptRow.problem_id, order_by=best_order()).label("rank"))
        .join(SolutionRow, SolutionRow.hash == AttemptRow.solution_hash)
        .where(AttemptRow.campaign_id == campaign_id, AttemptRow.status == PASSED, AttemptRow.kind == VERDICT_KIND,
               AttemptRow.problem_id.in_(list(problem_ids)))).subquery()
    found: dict[int, list[Candidate]] = {}
    seen: set[tuple[int, str]] = set()
    for row in session.execute(select(ranked).where(ranked.c.rank <= PARENT_CANDIDATES)
                               .order_by(ranked.c.problem_id, ranked.c.rank)):
        if (row.problem_id, row.solution_hash) not in seen:
            seen.add((row.problem_id, row.solution_hash))
            found.setdefault(row.problem_id, []).append(Candidate(row.solution_hash, row.language, row.parent_hash))
    return found


def recent_attempts(session: Session, campaign_id: int, problem_ids: Sequence[int]) -> dict[int, list[Recent]]:
    """Per problem, its latest finished attempts of the campaign, most recent first (a writer is
    never shown an evaluator's fault as its attempt's outcome)."""
    latest_first = (func.coalesce(AttemptRow.finished_at, AttemptRow.created_at).desc(), AttemptRow.id.desc())
    ranked = (select(AttemptRow.problem_id, AttemptRow.status, AttemptRow.message,
                     func.row_number().over(partition_by=AttemptRow.problem_id, order_by=latest_first).label("rank"))
              .where(AttemptRow.campaign_id == campaign_id, AttemptRow.status.not_in((*IN_FLIGHT, NOT_EVALUATED)),
                     AttemptRow.kind == VERDICT_KIND, AttemptRow.problem_id.in_(list(problem_ids)))).subquery()
    found: dict[int, list[Recent]] = {}
    for row in session.execute(select(ranked).where(ranked.c.rank <= RECENT)
                               .order_by(ranked.c.problem_id, ranked.c.rank)):
        found.setdefault(row.problem_id, []).append(Recent(row.status, row.message))
    return found

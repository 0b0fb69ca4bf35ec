"""The leaderboard kept between requests, per campaign scope, so that a page over 100,000 attempts
costs a few index lookups instead of ranking every attempt.

A problem's figures are recomputed when its attempts change:
- at once when an attempt finishes through the evaluator, which writes the attempt's final status,
  figures and traces rows in one transaction: each request reads the newest traces id (a
  primary-key lookup) and, when it moved, which problems the new traces rows belong to;
- within `recount_s` for any other change of an attempt's status (one made without traces rows, or
  a traces id committed out of order on PostgreSQL): every `recount_s` a request counts every
  problem's attempts by status (one read of the (problem_id, status) index) and recomputes the
  problems whose counts moved;
- within `max_age_s` for figures changed without a status change (a later rescoring, an edited
  definition): each request also recomputes the `refresh_per_request` problems whose figures are
  oldest past that age.
The result is what `shared.leaderboard.leaderboard` returns for the same DB, at most that late.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

from flask import Flask, current_app
from sqlalchemy.orm import Session

from shared.leaderboard import (
    Leaderboard,
    LeaderboardEntry,
    assemble_entries,
    check_campaign,
    entry,
    last_trace_id,
    problem_figures,
    problems_in_scope,
    problems_with_traces_after,
    status_counts,
)

EXTENSION = "kernelswarm.leaderboard_cache"


@dataclass
class _Cached:
    counts: tuple[tuple[str, int], ...]
    entry: LeaderboardEntry | None
    computed_at: float


@dataclass
class _Scope:
    lock: threading.Lock = field(default_factory=threading.Lock)
    problems: dict[int, _Cached] = field(default_factory=dict)
    trace_id: int | None = None
    recounted_at: float = float("-inf")


class LeaderboardCache:
    def __init__(self, recount_s: float = 5.0, max_age_s: float = 60.0, refresh_per_request: int = 20,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.recount_s = recount_s
        self.max_age_s = max_age_s
        self.refresh_per_request = refresh_per_request
        self.clock = clock
        self._scopes: dict[int | None, _Scope] = {}
        self._lock = threading.Lock()
        self.recomputed = 0  # problems recomputed so far (for tests and the bench)

    def leaderboard(self, session: Session, campaign_id: int | None = None) -> Leaderboard:
        check_campaign(session, campaign_id)
        generated_at = datetime.now(timezone.utc)
        with self._lock:
            scope = self._scopes.setdefault(campaign_id, _Scope())
        with scope.lock:  # one request recomputes a scope at a time; the others then find it fresh
            problems = problems_in_scope(session, campaign_id)
            ids = [p.id for p in problems]
            counts = self._changed_counts(session, scope, campaign_id, ids)
            stale = self._stale(scope, ids, counts)
            fresh = problem_figures(session, campaign_id, stale) if stale else {}
            now = self.clock()
            for problem_id in stale:
                known = scope.problems.get(problem_id)
                scope.problems[problem_id] = _Cached(
                    counts.get(problem_id, known.counts if known else ()), None, now)
            self.recomputed += len(stale)
            entries = []
            for problem in problems:
                cached = scope.problems[problem.id]
                if cached.entry is None or (cached.entry.name, cached.entry.op_type) != (problem.name, problem.op_type):
                    cached.entry = entry(problem, fresh[problem.id] if problem.id in fresh else cached.entry)
                entries.append(cached.entry)
            for gone in scope.problems.keys() - set(ids):
                del scope.problems[gone]
        return assemble_entries(generated_at, campaign_id, entries)

    def _changed_counts(self, session: Session, scope: _Scope, campaign_id: int | None,
                        ids: list[int]) -> dict[int, tuple]:
        """Fresh status counts of the problems that may have changed since the last request (all of
        them on a recount); the trace id is read first so that nothing written meanwhile is missed."""
        trace_id, now = last_trace_id(session), self.clock()
        if scope.trace_id is None or now - scope.recounted_at >= self.recount_s:
            counts = status_counts(session, campaign_id)
            scope.recounted_at = now
            counts = {problem_id: counts.get(problem_id, ()) for problem_id in ids}
        elif trace_id != scope.trace_id:
            touched = sorted(problems_with_traces_after(session, scope.trace_id, campaign_id) & set(ids))
            counts = status_counts(session, campaign_id, touched) if touched else {}
            counts = {problem_id: counts.get(problem_id, ()) for problem_id in touched}
        else:
            counts = {}
        scope.trace_id = trace_id
        return counts

    def _stale(self, scope: _Scope, problem_ids: list[int], counts: dict) -> list[int]:
        changed, aged = [], []
        deadline = self.clock() - self.max_age_s
        for problem_id in problem_ids:
            cached = scope.problems.get(problem_id)
            if cached is None or (problem_id in counts and cached.counts != counts[problem_id]):
                changed.append(problem_id)
            elif cached.computed_at < deadline:
                aged.append(problem_id)
        aged.sort(key=lambda problem_id: scope.problems[problem_id].computed_at)
        return changed + aged[:self.refresh_per_request]


def init_app(app: Flask, cache: LeaderboardCache | None = None) -> None:
    app.extensions[EXTENSION] = cache if cache is not None else LeaderboardCache()


def get_cache() -> LeaderboardCache:
    return current_app.extensions[EXTENSION]

"""Successive halving over one seed's tunable combinations, on growing subsets of the workloads.

Rung 0 runs every candidate on a few of the problem's workloads; the best 1/eta of each rung, by the
geometric mean of their latencies on that rung's workloads, go on to the next rung, which runs
about eta times as many workloads; the last rung runs them all. Its candidates, the finalists, are
therefore measured like any attempt: PASSED, rankable, and what the per-shape dispatch is built
from. With m candidates and n workloads (`rungs`):

- candidates entering rung r: c_0 = m, c_(r+1) = ceil(c_r / eta), for as long as at least
  `finalists` (2) would enter the next rung: the dispatch needs two fully measured variants;
- workloads of rung r, counted down from the last rung: n, ceil(n / eta), ceil(n / eta^2), ... 1;
- as many rungs as both lists allow. A single rung means nothing to halve (`next_step` says None).

27 candidates on 27 workloads with eta 3: 27 run 3 workloads, 9 run 9, 3 run 27; 243 workload
runs where running all of them on everything takes 729.

A rung's workloads are spread over the problem's list, which usually runs from small shapes to
large (`spread_order`): the middle one first, then each time the one farthest from those taken;
each rung's workloads include the previous rung's.

Stateless: `next_step` reads where the search stands from the recorded attempts (`Measured`) alone,
so the writer that takes over from one that died goes on where it stopped. A candidate's standing
on a rung comes from its finished attempt with the fewest workloads among those that include the
rung's (the one made for that rung; a full-set attempt, a seed's, counts on every rung): passed
(scored on the rung's workloads) or not (out); without one, an attempt in flight makes the rung
wait for it, and no attempt at all makes the candidate the next to run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from shared.schema import Solution

ETA = 3
FINALISTS = 2


@dataclass(frozen=True)
class Rung:
    candidates: int  # how many enter it
    workloads: int  # how many of the problem's workloads each runs


@dataclass(frozen=True)
class Measured:
    """One recorded attempt: what it ran, whether it finished and passed, its latency per workload."""

    attempt_id: str
    solution_hash: str
    workloads: frozenset[str]  # workload uuids; all of the problem's when the attempt ran them all
    finished: bool
    passed: bool  # PASSED or PARTIAL
    latency_ms: Mapping[str, float] = field(default_factory=dict)  # by workload uuid, the passed ones


@dataclass(frozen=True)
class Step:
    """What the halving needs next: `candidate` run on `workloads` (None: all of them); or the
    attempts in `waiting_on` finished; or, neither, nothing: it is done, `finalists` best first."""

    rung: int
    candidate: Solution | None = None
    workloads: tuple[str, ...] | None = None
    waiting_on: tuple[str, ...] = ()
    finalists: tuple[Solution, ...] = ()


def rungs(candidates: int, workloads: int, eta: int = ETA, finalists: int = FINALISTS) -> list[Rung]:
    """The plan (module docstring); one rung, everything on everything, when eta < 2."""
    if candidates < 1 or workloads < 1:
        return []
    if eta < 2:
        return [Rung(candidates, workloads)]
    counts = [candidates]
    while counts[-1] > 1 and math.ceil(counts[-1] / eta) >= finalists:
        counts.append(math.ceil(counts[-1] / eta))
    sizes = [workloads]
    while sizes[-1] > 1:
        sizes.append(math.ceil(sizes[-1] / eta))
    depth = min(len(counts), len(sizes))
    return [Rung(counts[r], sizes[depth - 1 - r]) for r in range(depth)]


def spread_order(n: int) -> list[int]:
    """Indices 0..n-1, the middle first, then each time the one farthest from those taken (the
    lowest of equals): every prefix is spread over the list."""
    if n < 1:
        return []
    order = [n // 2]
    distance = [abs(i - order[0]) for i in range(n)]
    while len(order) < n:
        farthest = max(range(n), key=lambda i: (distance[i], -i))
        order.append(farthest)
        distance = [min(d, abs(i - farthest)) for i, d in enumerate(distance)]
    return order


def rung_workloads(workloads: Sequence[str], size: int) -> tuple[str, ...]:
    """The first `size` of `spread_order`, in the problem's order."""
    chosen = sorted(spread_order(len(workloads))[:size])
    return tuple(workloads[i] for i in chosen)


def next_step(candidates: Sequence[Solution], workloads: Sequence[str], measured: Sequence[Measured],
              eta: int = ETA, finalists: int = FINALISTS) -> Step | None:
    """`candidates` in a fixed order (ties go to the earlier); `workloads`: the problem's uuids in
    order; `measured`: every attempt on the problem, oldest first. None when the plan has one rung."""
    plan = rungs(len(candidates), len(workloads), eta, finalists)
    if len(plan) < 2:
        return None
    by_hash: dict[str, list[Measured]] = {}
    for record in measured:
        by_hash.setdefault(record.solution_hash, []).append(record)
    alive = list(candidates)
    for r, rung in enumerate(plan):
        chosen = rung_workloads(workloads, rung.workloads)
        scored: list[tuple[float, int, Solution]] = []
        waiting: list[str] = []
        for index, candidate in enumerate(alive[:rung.candidates]):
            standing = _standing(by_hash.get(candidate.content_hash(), []), frozenset(chosen))
            if standing is None:
                return Step(r, candidate, None if rung.workloads == len(workloads) else chosen)
            if isinstance(standing, tuple):
                waiting.extend(standing)
            elif standing is not False:
                scored.append((standing, index, candidate))
        if waiting:
            return Step(r, waiting_on=tuple(waiting))
        alive = [candidate for _, _, candidate in sorted(scored, key=lambda item: item[:2])]
    return Step(len(plan) - 1, finalists=tuple(alive))


def _standing(records: list[Measured], chosen: frozenset[str]) -> float | bool | tuple[str, ...] | None:
    """The geometric mean latency on `chosen` (passed), False (out), the attempt ids to wait for,
    or None (never run on them)."""
    covering = [m for m in records if m.workloads >= chosen]
    finished = [m for m in covering if m.finished]
    if not finished:
        return tuple(m.attempt_id for m in covering) or None
    record = min(finished, key=lambda m: len(m.workloads))  # the earliest of the smallest
    if not record.passed:
        return False
    if any(uuid not in record.latency_ms for uuid in chosen):
        return math.inf  # passed without a latency to show (no traces): ranked last
    return math.exp(sum(math.log(max(record.latency_ms[uuid], 1e-12)) for uuid in chosen) / len(chosen))

"""The built-in writer for when no LLM is configured: submit the seeds, then walk `spec.tunables`.

Each proposal is a solution not yet tried on the problem: first every seed as written, then the
neighbours of the best passing solution (one tunable moved to another value), then any untried
combination of any seed's tunables. It returns None when the search space is exhausted.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from shared.schema import Solution

MAX_COMBINATIONS = 4096


@dataclass(frozen=True)
class Proposal:
    solution: Solution
    parent_hash: str | None
    reason: str


def with_tunables(seed: Solution, values: dict[str, object]) -> Solution:
    """The seed with `values` chosen; its name records the choice."""
    spec = seed.spec.model_copy(update={"tunable_values": dict(values)})
    suffix = ",".join(f"{k}={v}" for k, v in sorted(values.items()))
    base = seed.name.split("[", 1)[0]
    return seed.model_copy(update={"spec": spec, "name": f"{base}[{suffix}]" if suffix else base})


def base_of(solution: Solution, seeds: list[Solution]) -> Solution | None:
    """The seed a tuned variant came from (same sources and tunables)."""
    for seed in seeds:
        if seed.sources == solution.sources and seed.spec.tunables == solution.spec.tunables:
            return seed
    return None


def propose(seeds: list[Solution], tried: set[str], best: tuple[Solution, str] | None,
            rng: random.Random) -> Proposal | None:
    """`tried`: content hashes already attempted on the problem; `best`: (solution, hash).

    Seeds are proposed with their default tunable values written out, so that the same choice
    reached again through the grid has the same hash and is not evaluated twice.
    """
    seeds = [with_tunables(s, _current(s)) if s.spec.tunables else s for s in seeds]
    for seed in seeds:
        if seed.content_hash() not in tried:
            return Proposal(seed, None, "seed")
    if best is not None:
        best_solution, best_hash = best
        seed = base_of(best_solution, seeds)
        if seed is not None:
            neighbours = _neighbours(seed, best_solution)
            rng.shuffle(neighbours)
            for candidate in neighbours:
                if candidate.content_hash() not in tried:
                    return Proposal(candidate, best_hash, "neighbour of the best")
    for seed in seeds:
        grid = _grid(seed)
        rng.shuffle(grid)
        for candidate in grid:
            if candidate.content_hash() not in tried:
                return Proposal(candidate, seed.content_hash(), "untried combination")
    return None


def _current(solution: Solution) -> dict[str, object]:
    spec = solution.spec
    return {name: spec.tunable_values.get(name, values[0]) for name, values in spec.tunables.items()}


def _neighbours(seed: Solution, solution: Solution) -> list[Solution]:
    current = _current(solution)
    found = []
    for name, values in seed.spec.tunables.items():
        for value in values:
            if value != current[name]:
                found.append(with_tunables(seed, {**current, name: value}))
    return found


def _grid(seed: Solution) -> list[Solution]:
    names = list(seed.spec.tunables)
    combos = itertools.islice(itertools.product(*(seed.spec.tunables[n] for n in names)), MAX_COMBINATIONS)
    return [with_tunables(seed, dict(zip(names, combo))) for combo in combos]

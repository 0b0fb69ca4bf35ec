"""The built-in writer for when no LLM is configured: submit the seeds, then search `spec.tunables`.

Each proposal is a solution not yet tried on the problem, in this order:

1. every seed as written (its default tunable values written out), on every workload;
2. successive halving over each seed's tunable combinations, the best's seed first
   (`services/worker/halving.py`): every combination runs a few of the workloads, the best 1/eta
   (eta 3, `Settings.tuner_eta`) of each rung go on to a rung with about eta times as many, and
   the last rung runs every workload. Those attempts say which workloads they ran
   (`AttemptRow.workload_uuids`); one that passes them is PARTIAL, not PASSED, so it never becomes
   anyone's best. The halving's state is the problem's recorded attempts and traces
   (`Screening`), nothing else: a writer that died is replaced by one that goes on where it
   stopped. When a rung waits for attempts still in flight, `propose` says so (`Wait`);
3. the per-shape solution (below), once the halving is done;
4. the neighbours of the best passing solution (one tunable moved), then any untried combination
   of any seed's tunables, each on every workload: what is left after the halving, and the whole
   search when there is nothing to halve (one workload, fewer than `eta` combinations, or halving
   turned off with eta < 2).

It returns None when the search space is exhausted.

Per shape: the variants of one Python seed often win on different workloads (a small block for
small shapes, a large one for large). Once they do, judged by the traces of attempts that ran every
workload (the halving's finalists, the seeds), the tuner proposes a solution that dispatches each
workload's input shapes to the variant that was fastest on it (`dispatch_solution`); it is an
attempt like any other, kept only if it measures better.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass

from services.worker.halving import ETA, Measured, next_step
from shared.schema import Solution

MAX_COMBINATIONS = 4096


@dataclass(frozen=True)
class Proposal:
    solution: Solution
    parent_hash: str | None
    reason: str
    workloads: tuple[str, ...] | None = None  # run only these workload uuids (a halving rung); None: all


@dataclass(frozen=True)
class Wait:
    """Nothing to propose until one of these attempts finishes: a halving rung's candidates are
    still being evaluated (by another writer, or sent by one that died)."""

    attempt_ids: tuple[str, ...]


@dataclass(frozen=True)
class Screening:
    """What the halving reads: the problem's workload uuids in order and every attempt on it (on
    this device), oldest first."""

    workloads: tuple[str, ...]
    measured: tuple[Measured, ...]
    eta: int = ETA


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


def written_out(seeds) -> list[Solution]:
    """The seeds with their default tunable values written out, so that the same choice reached
    again through the grid has the same hash and is not evaluated twice."""
    return [with_tunables(s, current_values(s)) if s.spec.tunables else s for s in seeds]


def propose(seeds: list[Solution], tried: set[str], best: tuple[Solution, str] | None,
            rng: random.Random, dispatch: Callable[[], Solution | None] | None = None,
            screening: Screening | None = None) -> Proposal | Wait | None:
    """`tried`: content hashes already attempted on the problem; `best`: (solution, hash);
    `dispatch`: makes the per-shape dispatching solution of the current winners, if there is one
    (called only once every seed was tried and the halving is done: it reads the problem's
    traces); `screening`: the records the halving needs; None: no halving."""
    seeds = written_out(seeds)
    for seed in seeds:
        if seed.content_hash() not in tried:
            return Proposal(seed, None, "seed")
    if screening is not None:
        step = _halve(seeds, best, screening)
        if step is not None:
            return step
    dispatching = dispatch() if dispatch is not None else None
    if dispatching is not None and dispatching.content_hash() not in tried:
        return Proposal(dispatching, best[1] if best else None, "each shape to its fastest variant")
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


def _halve(seeds: list[Solution], best: tuple[Solution, str] | None, screening: Screening) -> Proposal | Wait | None:
    """The next step of the first seed whose halving is not done, the best's seed first."""
    first = base_of(best[0], seeds) if best is not None else None
    for seed in sorted(seeds, key=lambda s: s is not first):
        if not seed.spec.tunables:
            continue
        step = next_step(_grid(seed), screening.workloads, screening.measured, screening.eta)
        if step is None:
            continue
        if step.candidate is not None:
            ran = len(step.workloads) if step.workloads is not None else len(screening.workloads)
            return Proposal(step.candidate, seed.content_hash(),
                            f"halving rung {step.rung}: {ran} of {len(screening.workloads)} workloads", step.workloads)
        if step.waiting_on:
            return Wait(step.waiting_on)
    return None


def current_values(solution: Solution) -> dict[str, object]:
    spec = solution.spec
    return {name: spec.tunable_values.get(name, values[0]) for name, values in spec.tunables.items()}


def _neighbours(seed: Solution, solution: Solution) -> list[Solution]:
    current = current_values(solution)
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


PYTHON_LANGUAGES = ("pytorch", "triton")
DISPATCH_FILE = "_dispatch_by_shape.py"
DISPATCH = """\"\"\"Written by the tuner: each call goes to the variant of {entry} that was fastest on
inputs of its shapes (the tunable values per variant below); other shapes go to variant {default}.\"\"\"

import importlib.util
from pathlib import Path

VARIANTS = {variants!r}
BY_SHAPES = {by_shapes!r}
DEFAULT = {default!r}


def _load(index, values):
    path = Path(__file__).resolve().parent / {entry!r}
    spec = importlib.util.spec_from_file_location(f"_tuned_variant_{{index}}", path)
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update(values)  # the tunables, as the evaluator sets them: globals before the code runs
    spec.loader.exec_module(module)
    return getattr(module, {symbol!r})


_RUNS = [_load(index, values) for index, values in enumerate(VARIANTS)]


def run(*args, **kwargs):
    shapes = tuple(tuple(a.shape) for a in args if len(getattr(a, "shape", ())) > 0)
    return _RUNS[BY_SHAPES.get(shapes, DEFAULT)](*args, **kwargs)
"""


def shape_key(definition, workload, destination_passing: bool) -> tuple[tuple[int, ...], ...]:
    """The shapes of the tensors (not the scalars) a call gets on `workload`, inputs then outputs
    when the solution writes into them: what the dispatcher sees."""
    axes = definition.resolve_axes(dict(workload.axes))
    specs = list(definition.inputs.values()) + (list(definition.outputs.values()) if destination_passing else [])
    shapes = (definition.shape_of(spec, axes) for spec in specs)
    return tuple(tuple(shape) for shape in shapes if shape)


def dispatch_solution(seed: Solution, winners: dict[tuple, dict[str, object]], default: dict[str, object]) -> Solution | None:
    """A solution that runs, for each shape key, the variant of `seed` (its tunable values) that
    won there, and `default` elsewhere; None when fewer than two variants win or the seed is not
    Python (the tunables of compiled languages are build flags: one build cannot hold two)."""
    if seed.spec.language.value not in PYTHON_LANGUAGES or DISPATCH_FILE in {s.path for s in seed.sources}:
        return None
    variants: list[dict[str, object]] = [dict(default)]
    by_shapes: dict[tuple, int] = {}
    for key, values in sorted(winners.items(), key=lambda item: repr(item[0])):
        if dict(values) not in variants:
            variants.append(dict(values))
        by_shapes[key] = variants.index(dict(values))
    if len({index for index in by_shapes.values()}) < 2:
        return None
    source = DISPATCH.format(entry=seed.entry_file, symbol=seed.entry_symbol, variants=variants,
                             by_shapes=by_shapes, default=0)
    spec = seed.spec.model_copy(update={"entry_point": f"{DISPATCH_FILE}::run", "tunables": {}, "tunable_values": {}})
    base = seed.name.split("[", 1)[0]
    return seed.model_copy(update={
        "spec": spec, "name": f"{base}[by shape: {len(variants)} variants]",
        "sources": [*seed.sources, type(seed.sources[0])(path=DISPATCH_FILE, content=source)]})

"""The built-in tuner: seeds first, then neighbours of the best, then the rest of the grid, then None."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from services.worker.tuner import Proposal, base_of, propose, with_tunables
from shared.schema import Solution, load_problem

PROBLEMS = Path(__file__).resolve().parents[2] / "problems"


def seed_of(problem: str) -> Solution:
    seed = load_problem(PROBLEMS / problem).seed("pytorch")
    return seed


@pytest.fixture
def rmsnorm() -> Solution:
    """Tunables CHUNK_ROWS [0, 16, 128] x FP32_WEIGHT [False, True]: six combinations."""
    return seed_of("llama31_8b_rmsnorm")


def synthetic(name: str, tunables: dict | None = None, tunable_values: dict | None = None,
              body: str = "def run(x, out):\n    out.copy_(x)\n") -> Solution:
    return Solution.model_validate({
        "name": name, "definition": "synthetic", "author": "tests",
        "spec": {"languages": ["pytorch"], "target_hardware": ["CPU"], "entry_point": "main.py::run",
                 "tunables": tunables or {}, "tunable_values": tunable_values or {}},
        "sources": [{"path": "main.py", "content": body}],
    })


def walk(seeds: list[Solution], rng_seed: int = 0, tried: set[str] | None = None,
         best: tuple[Solution, str] | None = None) -> list[Proposal]:
    """Every proposal until exhaustion, each marked tried, with `best` held fixed."""
    tried = set() if tried is None else tried
    rng = random.Random(rng_seed)
    proposals = []
    while (proposal := propose(seeds, tried, best, rng)) is not None:
        digest = proposal.solution.content_hash()
        assert digest not in tried, f"{proposal.solution.name} proposed twice"
        tried.add(digest)
        proposals.append(proposal)
        assert len(proposals) <= 100, "propose does not converge"
    return proposals


def values(proposal: Proposal) -> tuple:
    return tuple(sorted(proposal.solution.spec.tunable_values.items()))


def test_seeds_come_first_each_once_with_their_defaults_written_out(rmsnorm):
    plain = synthetic("plain")  # no tunables: proposed exactly as written
    partial = synthetic("partial", {"A": [1, 2], "B": ["x", "y"]}, {"B": "y"})
    proposals = walk([rmsnorm, plain, partial])

    assert [p.reason for p in proposals[:3]] == ["seed"] * 3
    assert all(p.reason != "seed" for p in proposals[3:])
    assert all(p.parent_hash is None for p in proposals[:3])
    first, second, third = (p.solution for p in proposals[:3])
    assert first.spec.tunable_values == {"CHUNK_ROWS": 0, "FP32_WEIGHT": False}
    assert first.name == "llama31_8b_rmsnorm_pytorch_seed[CHUNK_ROWS=0,FP32_WEIGHT=False]"
    assert first.sources == rmsnorm.sources
    assert second == plain
    assert third.spec.tunable_values == {"A": 1, "B": "y"}  # the seed's own choice is kept


def test_a_tried_seed_is_skipped(rmsnorm):
    plain = synthetic("plain")
    proposal = propose([plain, rmsnorm], {plain.content_hash()}, None, random.Random(0))
    assert proposal.reason == "seed"
    assert proposal.solution.name.startswith("llama31_8b_rmsnorm_pytorch_seed[")


def test_the_default_combination_reached_through_the_grid_is_not_proposed_again(rmsnorm):
    proposals = walk([rmsnorm])
    combos = [values(p) for p in proposals]
    assert len(proposals) == 6 and len(set(combos)) == 6
    assert len({p.solution.content_hash() for p in proposals}) == 6
    default = with_tunables(rmsnorm, {"FP32_WEIGHT": False, "CHUNK_ROWS": 0})  # key order is irrelevant
    assert default.content_hash() == proposals[0].solution.content_hash()


def test_a_round_trip_through_json_keeps_the_hash(rmsnorm):
    """The writer reads the best back from the store; its neighbours must hash the same way."""
    tuned = with_tunables(rmsnorm, {"CHUNK_ROWS": 128, "FP32_WEIGHT": True})
    again = Solution.model_validate_json(tuned.canonical_json())
    assert again.content_hash() == tuned.content_hash()
    assert base_of(again, [rmsnorm]) == rmsnorm


def test_neighbours_of_the_best_come_before_other_combinations(rmsnorm):
    seed = with_tunables(rmsnorm, {"CHUNK_ROWS": 0, "FP32_WEIGHT": False})
    best = with_tunables(rmsnorm, {"CHUNK_ROWS": 128, "FP32_WEIGHT": True})
    tried = {seed.content_hash(), best.content_hash()}
    proposals = walk([rmsnorm], tried=tried, best=(best, best.content_hash()))

    neighbours = {(("CHUNK_ROWS", 0), ("FP32_WEIGHT", True)), (("CHUNK_ROWS", 16), ("FP32_WEIGHT", True)),
                  (("CHUNK_ROWS", 128), ("FP32_WEIGHT", False))}
    assert {values(p) for p in proposals[:3]} == neighbours
    assert all(p.reason == "neighbour of the best" for p in proposals[:3])
    assert all(p.parent_hash == best.content_hash() for p in proposals[:3])
    (rest,) = proposals[3:]
    assert values(rest) == (("CHUNK_ROWS", 16), ("FP32_WEIGHT", False))
    assert rest.reason == "untried combination"
    assert rest.parent_hash == seed.content_hash()  # the seed as proposed, defaults written out


def test_a_best_not_derived_from_a_seed_falls_back_to_the_grid(rmsnorm):
    stranger = synthetic("written by someone else", {"CHUNK_ROWS": [0, 16, 128]}, {"CHUNK_ROWS": 16},
                         body="def run(x, w, out):\n    pass\n")
    assert base_of(stranger, [rmsnorm]) is None
    seed = with_tunables(rmsnorm, {"CHUNK_ROWS": 0, "FP32_WEIGHT": False})
    proposal = propose([rmsnorm], {seed.content_hash()}, (stranger, stranger.content_hash()), random.Random(0))
    assert proposal.reason == "untried combination"
    assert proposal.solution.sources == rmsnorm.sources


def test_base_of_finds_the_seed_of_a_tuned_variant(rmsnorm):
    other = seed_of("llama31_8b_swiglu")
    tuned = with_tunables(other, {"CHUNK_TOKENS": 32, "MODE": "bf16"})
    assert base_of(tuned, [rmsnorm, other]) == other
    assert base_of(synthetic("plain"), [rmsnorm, other]) is None


def test_exhaustion_returns_none():
    plain = synthetic("plain")
    rng = random.Random(0)
    assert propose([plain], {plain.content_hash()}, None, rng) is None
    assert propose([plain], {plain.content_hash()}, (plain, plain.content_hash()), rng) is None
    assert propose([], set(), None, rng) is None


def test_every_combination_of_every_seed_is_proposed_once_then_none(rmsnorm):
    gemm, swiglu = seed_of("llama31_8b_gemm_o_proj"), seed_of("llama31_8b_swiglu")
    proposals = walk([rmsnorm, gemm, swiglu])
    assert len(proposals) == 6 + 4 + 9
    tried = {p.solution.content_hash() for p in proposals}
    assert propose([rmsnorm, gemm, swiglu], tried, None, random.Random(1)) is None


def test_deterministic_for_a_given_rng_seed():
    swiglu = seed_of("llama31_8b_swiglu")

    def names(rng_seed: int, best_values: dict) -> list[str]:
        best = with_tunables(swiglu, best_values)
        return [p.solution.name for p in walk([swiglu], rng_seed, best=(best, best.content_hash()))]

    best_values = {"CHUNK_TOKENS": 8, "MODE": "functional"}
    assert names(3, best_values) == names(3, best_values)
    assert len({tuple(names(n, best_values)) for n in range(8)}) > 1  # the rng does pick the order


def test_names_record_the_choice_without_nesting_suffixes(rmsnorm):
    once = with_tunables(rmsnorm, {"CHUNK_ROWS": 16, "FP32_WEIGHT": True})
    twice = with_tunables(once, {"FP32_WEIGHT": False, "CHUNK_ROWS": 128})
    assert once.name == "llama31_8b_rmsnorm_pytorch_seed[CHUNK_ROWS=16,FP32_WEIGHT=True]"
    assert twice.name == "llama31_8b_rmsnorm_pytorch_seed[CHUNK_ROWS=128,FP32_WEIGHT=False]"
    assert with_tunables(twice, {}).name == "llama31_8b_rmsnorm_pytorch_seed"
    assert twice.spec.tunable_values == {"CHUNK_ROWS": 128, "FP32_WEIGHT": False}
    assert rmsnorm.spec.tunable_values == {}  # the seed itself is untouched

    best = with_tunables(rmsnorm, {"CHUNK_ROWS": 16, "FP32_WEIGHT": True})
    for proposal in walk([rmsnorm], best=(best, best.content_hash())):
        assert proposal.solution.name.count("[") == 1, proposal.solution.name

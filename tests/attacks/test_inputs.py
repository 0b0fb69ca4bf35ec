"""Issue 40, row H1 (item 3, "inputs out of reach until timed"): a candidate that reads the timed
input sets before its timed runs start, precomputes every answer at import and only looks them
up while it is timed, PASSED at 143x its honest twin on the CPU evaluator: the sets waited for
the outer clock's `go` in a `.t<hex>` folder of the attempt's folder, which the candidate's view
shows, and which a candidate that keeps uid 0 (no capabilities, owner bits only) reads.

Each attack is written so that reading a timed set early is its only route to the right answer
(the way tests/hacks writes its probes): it answers from its table, and writes zeros for a set it
never saw. It looks everywhere a set file could be before its window: the attempt's folder and
all below it, the scratch root as its view shows it, and the working folders and roots of every
process it can read through /proc. A hole shows as PASSED; the honest twin beside each, through
the same evaluation, must PASS, so a stage that simply breaks cannot pass the attack's test.

Two ways the sets travel as files, both covered: the CPU's default (random inputs saved as files,
`EvalConfig.regenerate_inputs` None) and a workload with a safetensors input (files on every device).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from shared.schema import Status
from tests.attacks.inputskit import HONEST, PRECOMPUTES
from tests.hacks.hackkit import Attempts, Case, assert_status, start_attempts

CPU_DEFAULT = {"regenerate_inputs": None}  # random sets as files, as the CPU evaluator has them (FAST makes them again)

CASES = [
    Case("precomputes_the_timed_sets_read_at_import", Status.INCORRECT_NUMERICAL, PRECOMPUTES,
         caught="timed run on input set", config=CPU_DEFAULT),
    Case("precomputes_the_timed_sets_of_a_safetensors_workload", Status.INCORRECT_NUMERICAL, PRECOMPUTES,
         caught="timed run on input set", problem="affine_from_file"),
]
CONTROLS = [
    Case("honest_twin", Status.PASSED, HONEST, config=CPU_DEFAULT),
    Case("honest_twin_of_a_safetensors_workload", Status.PASSED, HONEST, problem="affine_from_file"),
]


@pytest.fixture(scope="module")
def attempts(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Attempts]:
    yield from start_attempts(request, tmp_path_factory.mktemp("inputs"), [*CASES, *CONTROLS])


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_timed_sets_are_out_of_reach_until_their_window(attempts: Attempts, case: Case) -> None:
    """Not PASSED: its timed runs met sets it could not read at import (zeros: INCORRECT_NUMERICAL),
    while its correctness rounds, whose sets it may read, were right."""
    assert_status(attempts[case], case)


@pytest.mark.parametrize("case", CONTROLS, ids=[c.id for c in CONTROLS])
def test_the_honest_twin_passes(attempts: Attempts, case: Case) -> None:
    assert_status(attempts[case], case)


def test_the_timed_sets_folder_lies_beside_the_attempt_folder_and_goes_with_it(tmp_path) -> None:
    """Where the attacks above look first: the timed sets' folder of an attempt without a spare
    reference is not below the attempt folder (which the candidate's view shows), but beside it in
    the scratch root (which its private /tmp and /dev/shm do not show); both are removed at the end."""
    from services.evaluator.evaluate import _Children
    from tests.evaluator.evalkit import FAST

    scratch = tmp_path / "scratch"
    children = _Children(dataclasses.replace(FAST, scratch_dir=scratch))
    timed, attempt = children.dirs["timed"], children.root
    assert timed.is_dir() and attempt not in timed.parents and timed.parent.parent == attempt.parent == scratch
    assert not any(p.name.startswith(".t") for p in attempt.iterdir())
    children.close()
    assert list(scratch.iterdir()) == []

"""Input sets made again in the candidate's process: a workload of random and scalar inputs sends
the candidate each set's seed and digest instead of a file; a workload with a safetensors input
still sends files; a set that comes out differently in the candidate is INVALID_REFERENCE, not a
verdict on the solution; the attempt's secret never reaches the candidate's job.

Each test runs a whole evaluation with the parent's `run_child` wrapped, to see (or edit) each
child's job and the attempt's input folder after each child ran."""

from __future__ import annotations

import dataclasses

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from evalkit import FAST, affine_definition, affine_workloads, make_problem, make_solution
from services.evaluator import evaluate as evaluation
from services.evaluator.protocol import CandidateJob
from services.evaluator.harness.reference_role import set_seed
from services.evaluator.harness.inputs import digest, make_inputs
from shared.schema import Problem, Status, load_problem

SECRET = 0xB1A5_ED5E_C4E7  # the attempt's secret, made known to the test
AFFINE = "def run(x, w, b, y):\n    y.copy_(x * w + b)\n"  # as the reference computes it
# Logs the values of every input set it is called on, in call order, per workload (by rows).
LOGS_INPUTS = """
import json
from pathlib import Path

CALLS = {}

def run(x, w, b, y):
    CALLS.setdefault(x.shape[0], []).append([t.flatten().tolist() for t in (x, w, b)])
    Path("@LOG@").write_text(json.dumps(CALLS))
    y.copy_(x * w + b)
"""


class _KnownSecret:
    """Stands in for the `secrets` module in the parent: the attempt's secret is `SECRET`."""

    @staticmethod
    def randbits(bits: int) -> int:
        return SECRET

    token_hex = staticmethod(secrets.token_hex)


@dataclass
class Seen:
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # role -> its job, as written
    job_texts: dict[str, str] = field(default_factory=dict)
    input_files: dict[str, list[str]] = field(default_factory=dict)  # role -> inputs_dir after it ran
    handed: dict[str, dict[str, Any]] = field(default_factory=dict)  # uuid -> what the outer clock's `go` carried


def _watch(monkeypatch: pytest.MonkeyPatch, edit: Callable[[dict], None] | None = None) -> Seen:
    """Record every child's job and the input folder after it; `edit` the candidate's job first."""
    seen, run_child, hand_over = Seen(), evaluation.run_child, evaluation.timed_hand_over
    monkeypatch.setattr(evaluation, "secrets", _KnownSecret)

    def recorded(*args):
        handing = hand_over(*args)

        def hand(uuid: str) -> dict[str, Any]:
            seen.handed[uuid] = handing(uuid)
            return seen.handed[uuid]
        return hand

    monkeypatch.setattr(evaluation, "timed_hand_over", recorded)

    def child(home: Path, config, start, job, *hand_over):
        if edit is not None and job.role == "candidate":
            data = job.model_dump(mode="json")
            edit(data)
            job = CandidateJob.model_validate(data)
        ran = run_child(home, config, start, job, *hand_over)
        seen.job_texts[job.role] = (home / "job.json").read_text()
        seen.jobs[job.role] = json.loads(seen.job_texts[job.role])
        seen.input_files[job.role] = sorted(p.name for p in Path(job.inputs_dir).iterdir())
        return ran

    monkeypatch.setattr(evaluation, "run_child", child)
    return seen


def _set_count(seen: Seen, k: int) -> int:
    return seen.jobs["candidate"]["correctness_rounds"] + seen.jobs["candidate"]["timed_sets"][k]


@pytest.fixture
def from_file(tmp_path: Path) -> Problem:
    """The affine problem with `w` read from a safetensors file (x and b random)."""
    inputs = {"x": {"type": "random"}, "b": {"type": "random"},
              "w": {"type": "safetensors", "path": "data/w.safetensors", "tensor_key": "w"}}
    folder = make_problem(tmp_path, affine_definition(name="from_file"), affine_workloads(inputs=inputs)).root
    (folder / "data").mkdir()
    save_file({"w": torch.linspace(-2.0, 2.0, 16)}, str(folder / "data" / "w.safetensors"))
    return load_problem(folder, with_seeds=False)


def test_the_digest_tells_sets_apart_by_any_bit_and_place() -> None:
    x = torch.randn(5000)
    same = digest({"x": x.clone(), "alpha": 0.5})
    assert digest({"x": x, "alpha": 0.5}) == same == json.loads(json.dumps(same))
    swapped, bumped = x.clone(), x.clone()
    swapped[[0, 2]] = swapped[[2, 0]]
    bumped.view(torch.int32)[4999] += 1  # the last element's lowest bit
    for other in (swapped, bumped, x.double(), x.reshape(50, 100)):
        assert digest({"x": other, "alpha": 0.5}) != same
    assert digest({"x": x, "alpha": 0.25}) != same
    odd = torch.randint(0, 2, (1001,), dtype=torch.bool)[1:]  # a view words cannot start at, bytes left over
    assert digest({"m": odd}) == digest({"m": odd.clone()}) != digest({"m": ~odd})


def test_random_sets_are_made_again_not_written(affine: Problem, drop: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _watch(monkeypatch)
    log = drop / "calls.json"
    result = evaluation.evaluate(affine, make_solution(LOGS_INPUTS.replace("@LOG@", str(log))), FAST)
    assert result.status is Status.PASSED, result.message
    assert seen.input_files == {"reference": [], "candidate": []}  # no input set went through a file
    assert "load" not in result.child_phases["candidate"] and "inputs" in result.child_phases["candidate"]
    # Every call saw exactly the reference's set: rounds, the warm-up (the last round again), timed sets.
    calls = json.loads(log.read_text())
    for k, workload in enumerate(affine.workloads):
        rounds, count = FAST.correctness_rounds, _set_count(seen, k)
        sets = [make_inputs(affine.definition, workload, set_seed(SECRET, k, s), torch.device("cpu"), None, None)
                for s in range(count)]
        order = [*range(rounds), *[rounds - 1] * FAST.warmup_runs, *range(rounds, count)]
        assert calls[str(workload.axes["n"])] == [[sets[s][n].flatten().tolist() for n in "xwb"] for s in order]
    assert all(t.evaluation.correctness.max_absolute_error == 0.0 for t in result.traces)


def test_on_a_cpu_random_sets_go_through_files_unless_asked(affine: Problem, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default follows the device: drawn again on a GPU, files on a CPU (faster there)."""
    assert dataclasses.replace(FAST, regenerate_inputs=None, device="cuda").regenerates_inputs
    seen = _watch(monkeypatch)
    result = evaluation.evaluate(affine, make_solution(AFFINE), dataclasses.replace(FAST, regenerate_inputs=None))
    assert result.status is Status.PASSED, result.message
    assert seen.jobs["candidate"]["set_seeds"] == [None, None]
    # the timed sets' files reach the inputs folder only at the outer clock's `go`
    assert len(seen.input_files["reference"]) == 2 * FAST.correctness_rounds
    assert len(seen.input_files["candidate"]) == sum(_set_count(seen, k) for k in range(2))
    assert "load" in result.child_phases["candidate"] and "inputs" not in result.child_phases["candidate"]


def test_sets_with_a_safetensors_input_still_go_through_files(from_file: Problem,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _watch(monkeypatch)
    result = evaluation.evaluate(from_file, make_solution(AFFINE, "from_file"), FAST)
    assert result.status is Status.PASSED, result.message
    job = seen.jobs["candidate"]
    assert job["set_seeds"] == [None, None] and job["set_digests"] == [None, None]
    files = sorted(f"w{k}_s{s}.st" for k in range(2) for s in range(_set_count(seen, k)))
    assert seen.input_files["reference"] == [f for f in files if int(f[4:-3]) < FAST.correctness_rounds]
    assert seen.input_files["candidate"] == files
    assert "load" in result.child_phases["candidate"]


def _other_seeds(job: dict) -> None:
    job["set_seeds"] = [[seed ^ 1 for seed in seeds] for seeds in job["set_seeds"]]


def _other_digest(job: dict) -> None:
    job["set_digests"][0][0][0][3] += 1  # workload 0, set 0, input x: its byte sum


@pytest.mark.parametrize("edit", [_other_seeds, _other_digest], ids=["other_seeds", "other_digest"])
def test_a_set_made_differently_is_an_invalid_reference(affine: Problem, edit: Callable[[dict], None],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _watch(monkeypatch, edit)
    result = evaluation.evaluate(affine, make_solution(AFFINE), FAST)
    assert result.traces[0].evaluation.status is Status.INVALID_REFERENCE, result.message
    assert result.status is Status.INVALID_REFERENCE
    assert "input set 0 could not be made again identically in the candidate's process (x" in result.message
    assert "not the solution's fault" in result.message


def test_a_set_made_differently_by_the_solutions_doing_is_caught_too(affine: Problem) -> None:
    """The solution changes, at import, how its own process makes inputs, in a way the guard does
    not watch (a table's contents): its sets come out as float64, and the digest says so."""
    retypes = """
        import torch

        from services.evaluator.harness import inputs
        from shared.schema.definition import DType

        inputs.TORCH_DTYPES[DType.FLOAT32] = torch.float64

        def run(x, w, b, y):
            y.copy_(x * w + b)
        """
    result = evaluation.evaluate(affine, make_solution(retypes), FAST)
    assert [t.evaluation.status for t in result.traces] == [Status.INVALID_REFERENCE] * 2, result.message
    assert "input set 0 could not be made again identically" in result.message


def test_the_secret_never_reaches_the_candidates_job(affine: Problem, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _watch(monkeypatch)
    result = evaluation.evaluate(affine, make_solution(AFFINE), FAST)
    assert result.status is Status.PASSED, result.message
    assert seen.jobs["reference"]["seed"] == SECRET  # the known secret was the attempt's
    text = seen.job_texts["candidate"]
    assert str(SECRET) not in text and '"seed"' not in text
    rounds = FAST.correctness_rounds  # the timed sets' seeds arrive only with the outer clock's `go`
    assert seen.jobs["candidate"]["set_seeds"] == [[set_seed(SECRET, k, s) for s in range(rounds)] for k in range(2)]
    assert [seen.handed[w.uuid]["set_seeds"] for w in affine.workloads] == [
        [set_seed(SECRET, k, s) for s in range(rounds, _set_count(seen, k))] for k in range(2)]
    off = _watch(monkeypatch)  # without it, the job holds them all
    evaluation.evaluate(affine, make_solution(AFFINE), dataclasses.replace(FAST, outer_clock=False))
    assert off.jobs["candidate"]["set_seeds"] == [[set_seed(SECRET, k, s) for s in range(_set_count(off, k))]
                                                  for k in range(2)]

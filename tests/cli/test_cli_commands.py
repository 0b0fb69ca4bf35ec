"""The `kernelswarm` command: `eval`, `problems validate` and `problems list`, with their exit codes
(0 all good, 1 a failed verdict or an invalid problem, 2 a usage error) and their output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kernelswarm.cli import main
from shared.schema import Status, Trace, load_problem
from shared.settings import Settings

REPO = Path(__file__).resolve().parents[2]
PROBLEMS = REPO / "problems"
RMSNORM = PROBLEMS / "llama31_8b_rmsnorm"
SAMPLE = REPO.parent / "shared" / "sol-execbench-sample"
SAMPLE_SIZE = 30
BLOBS_PROBLEM = "016_gqa_ragged_prefill_causal_h32_kv4_d128"  # the sample's one problem with safetensors inputs

# A fast evaluation: the CLI reads its settings from KERNELSWARM_* like every entry point.
FAST_ENV = {
    "KERNELSWARM_DEVICE": "cpu",
    "KERNELSWARM_CORRECTNESS_ROUNDS": "2",
    "KERNELSWARM_TIMING_SETS": "2",
    "KERNELSWARM_WARMUP_RUNS": "1",
    "KERNELSWARM_TIMING_RUNS": "3",
    "KERNELSWARM_TIMING_BUDGET_S": "0.2",
    "KERNELSWARM_ATTEMPT_TIMEOUT_S": "60",
}

DEFINITION = {
    "name": "scale",
    "axes": {"n": {"type": "var"}},
    "inputs": {"x": {"shape": ["n"], "dtype": "float32"}, "w": {"shape": ["n"], "dtype": "float32"}},
    "outputs": {"y": {"shape": ["n"], "dtype": "float32"}},
    "reference": "def run(x, w):\n    return x * w\n",
}
WORKLOAD = {"uuid": "scale-8", "axes": {"n": 8}, "inputs": {"x": {"type": "random"}, "w": {"type": "random"}}}


def solution_json(definition: str, code: str, name: str = "candidate") -> dict:
    return {"name": name, "definition": definition, "author": "tests",
            "spec": {"languages": ["pytorch"], "target_hardware": ["CPU"], "entry_point": "main.py::run"},
            "sources": [{"path": "main.py", "content": code}]}


def write_problem(folder: Path, definition: dict = DEFINITION, workloads: tuple[dict, ...] = (WORKLOAD,)) -> Path:
    folder.mkdir(parents=True)
    (folder / "definition.json").write_text(json.dumps(definition))
    (folder / "workload.jsonl").write_text("".join(json.dumps(w) + "\n" for w in workloads))
    return folder


def write_json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data))
    return path


@dataclass(frozen=True)
class Ran:
    code: int
    stdout: str
    stderr: str


@pytest.fixture(autouse=True)
def _home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever a command stores (the build cache...) goes to a temp home, never the repo's."""
    monkeypatch.setenv("KERNELSWARM_HOME", str(tmp_path_factory.mktemp("home")))


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELSWARM_") or k == "KERNELSWARM_HOME"}
    return {**env, **FAST_ENV, "COLUMNS": "1000", **extra}  # wide: rich must not wrap the messages


def start(*args: str | Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "kernelswarm.cli", *map(str, args)], cwd=REPO, env=_env(**env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen[str]) -> Ran:
    stdout, stderr = process.communicate(timeout=300)
    return Ran(process.returncode, stdout, stderr)


def kernelswarm(*args: str | Path, **env: str) -> Ran:
    return finish(start(*args, **env))


def flat(text: str) -> str:
    return " ".join(text.split())


def traces(jsonl: str) -> list[Trace]:
    return [Trace.model_validate_json(line) for line in jsonl.splitlines() if line.strip()]


# --- eval ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def evals(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Ran, Path]]]:
    """The two evaluations of this module, run side by side (each costs two torch child processes)."""
    tmp = tmp_path_factory.mktemp("cli-eval")
    home = {"KERNELSWARM_HOME": str(tmp / "home")}
    seed_out = tmp / "seed.jsonl"
    failing = write_problem(tmp / "scale")
    solution = write_json(tmp / "solution.json",
                          solution_json("scale", "def run(x, w, y):\n    y.copy_(x)\n", "ignores_w"))
    running = {
        "seed": (start("eval", RMSNORM, "--solution", RMSNORM / "solutions" / "pytorch_seed.json",
                       "--device", "cpu", "--max-workloads", "2", "--json", "-o", seed_out, **home), seed_out),
        "failing": (start("eval", failing, "--solution", solution, "--json", **home), failing),
    }
    yield {name: (finish(process), path) for name, (process, path) in running.items()}


def test_eval_seed_passes_with_jsonl_traces(evals: dict[str, tuple[Ran, Path]]) -> None:
    ran, out = evals["seed"]
    assert ran.code == 0, ran.stderr
    printed = traces(ran.stdout)
    assert [t.evaluation.status for t in printed] == [Status.PASSED, Status.PASSED]
    assert [t.workload.axes for t in printed] == [{"num_tokens": 1}, {"num_tokens": 8}]
    assert {(t.definition, t.solution) for t in printed} == {("llama31_8b_rmsnorm", "llama31_8b_rmsnorm_pytorch_seed")}
    assert all(t.evaluation.performance.latency_ms > 0 for t in printed)
    for t in printed:  # each latency with its interval over the timed runs, the reference's too
        timing, performance = t.evaluation.timing, t.evaluation.performance
        assert timing.min_ms <= timing.q1_ms <= timing.median_ms <= timing.q3_ms <= timing.max_ms
        assert timing.reference_q1_ms <= performance.reference_latency_ms <= timing.reference_q3_ms
    assert out.read_text() == ran.stdout  # -o writes the same JSONL
    assert "llama31_8b_rmsnorm_pytorch_seed on llama31_8b_rmsnorm: PASSED" in ran.stderr


def test_eval_failing_solution_exits_1(evals: dict[str, tuple[Ran, Path]]) -> None:
    ran, _ = evals["failing"]
    assert ran.code == 1, ran.stderr
    [trace] = traces(ran.stdout)
    assert trace.evaluation.status is Status.INCORRECT_NUMERICAL
    assert "output `y`" in trace.evaluation.log
    assert "ignores_w on scale: INCORRECT_NUMERICAL" in ran.stderr


def test_eval_missing_problem_folder_exits_2(tmp_path: Path) -> None:
    ran = kernelswarm("eval", tmp_path / "nowhere", "--solution", RMSNORM / "solutions" / "pytorch_seed.json")
    assert ran.code == 2
    assert f"error: {tmp_path / 'nowhere'}: not a problem folder" in ran.stderr
    assert ran.stdout == ""


@pytest.mark.parametrize(("content", "message"), [
    ('{"name": "x",\n', "{path}:2:1: invalid JSON"),
    (json.dumps({"name": "x", "definition": "scale", "author": "a", "sources": []}), "{path}: $.spec: Field required"),
    (json.dumps({**solution_json("scale", "x = 1\n"), "spec": {"languages": ["pytorch"], "target_hardware": ["CPU"],
                                                               "entry_point": "main.py"}}),
     "{path}: $.spec: Value error, entry_point must be `<file>::<function>`"),
], ids=["invalid-json", "missing-field", "bad-entry-point"])
def test_eval_malformed_solution_exits_2(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "solution.json"
    path.write_text(content)
    ran = kernelswarm("eval", RMSNORM, "--solution", path)
    assert ran.code == 2
    assert message.format(path=path) in ran.stderr
    assert "Traceback" not in ran.stderr


def test_eval_missing_solution_file_exits_2(tmp_path: Path) -> None:
    ran = kernelswarm("eval", RMSNORM, "--solution", tmp_path / "none.json")
    assert ran.code == 2
    assert f"{tmp_path / 'none.json'}: file not found" in ran.stderr


def test_eval_rejects_zero_workloads(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:  # argparse's refusal (kernelswarm/arguments.py), before anything runs
        main(["eval", str(RMSNORM), "--solution", str(RMSNORM / "solutions" / "pytorch_seed.json"),
              "--max-workloads", "0"])
    assert exited.value.code == 2
    assert "argument --max-workloads: 0 is out of range: a count is from 1" in flat(capsys.readouterr().err)


# --- problems validate / list -----------------------------------------------------------------------


@pytest.mark.skipif(not SAMPLE.is_dir(), reason=f"SOL-ExecBench sample not found at {SAMPLE}")
def test_validate_the_sol_execbench_sample() -> None:
    """Every problem loads; the one whose workloads take inputs from safetensors blobs that the sample
    does not hold fails, naming each missing file."""
    ran = kernelswarm("problems", "validate", SAMPLE)
    assert ran.code == 1, ran.stderr
    assert f"{SAMPLE_SIZE - 1} of {SAMPLE_SIZE} problems valid" in ran.stderr
    [failed] = [line for line in ran.stderr.splitlines() if line.startswith("FAIL")]
    assert failed == f"FAIL {SAMPLE / 'FlashInfer-Bench' / BLOBS_PROBLEM}"
    missing = [line for line in ran.stderr.splitlines() if ": no such file (safetensors data of" in line]
    assert len(missing) == 15  # a file per workload
    assert missing[0] == (
        f"data/flashinfer-trace/blob/workloads/gqa_ragged/{BLOBS_PROBLEM[4:]}/{BLOBS_PROBLEM[4:]}_"
        "ea71541de7204f1eb20bde1415795cc9.safetensors: no such file (safetensors data of `qo_indptr`, "
        "`kv_indptr` in workload 1 (ebf7188b-4b31-4746-b57b-fa25b53f5e3e))")


def test_validate_reports_each_missing_safetensors_file(tmp_path: Path) -> None:
    def from_file(path: str, key: str) -> dict:
        return {"type": "safetensors", "path": path, "tensor_key": key}

    workloads = tuple({"uuid": f"w{i}", "axes": {"n": 8}, "inputs": {"x": from_file(x, "x"), "w": from_file(w, "w")}}
                      for i, (x, w) in enumerate([("data/x.safetensors", "data/w.safetensors"),
                                                  ("data/x.safetensors", "data/here.safetensors")], start=1))
    folder = write_problem(tmp_path / "scale", workloads=workloads)
    (folder / "data").mkdir()
    (folder / "data" / "here.safetensors").write_bytes(b"")
    ran = kernelswarm("problems", "validate", folder)
    assert ran.code == 1
    assert f"FAIL {folder}" in ran.stderr and "0 of 1 problems valid" in ran.stderr
    missing = [line for line in ran.stderr.splitlines() if "no such file" in line]
    assert missing == ["data/x.safetensors: no such file (safetensors data of `x` in workload 1 (w1) and 1 more "
                       "workload)",
                       "data/w.safetensors: no such file (safetensors data of `w` in workload 1 (w1))"]

    (folder / "data" / "x.safetensors").write_bytes(b"")
    (folder / "data" / "w.safetensors").write_bytes(b"")
    assert kernelswarm("problems", "validate", folder).code == 0


def test_validate_our_problems(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["problems", "validate", str(PROBLEMS)]) == 0
    err = flat(capsys.readouterr().err)
    shipped = sum(1 for folder in PROBLEMS.iterdir() if (folder / "definition.json").exists())
    assert shipped >= 24  # the library's size (issue 8)
    assert f"{shipped} of {shipped} problems valid" in err
    assert "llama31_8b_rmsnorm: 6 workloads, 3 seed solutions" in err


@pytest.mark.parametrize(("broken", "message"), [
    ("definition", "{bad}/definition.json: $.inputs.x.dtype: Input should be"),
    ("workload", "{bad}/workload.jsonl:2: $.axes.m: not an axis of scale"),
    ("seed", "{bad}/solutions/pytorch_seed.json: $.definition: 'other' is not 'scale'"),
], ids=["definition", "workload", "seed"])
def test_validate_broken_folder_exits_1_naming_the_json_path(tmp_path: Path, broken: str, message: str) -> None:
    good = write_problem(tmp_path / "good")
    if broken == "definition":
        bad = write_problem(tmp_path / "bad", {**DEFINITION, "inputs": {**DEFINITION["inputs"],
                                                                         "x": {"shape": ["n"], "dtype": "float33"}}})
    elif broken == "workload":
        unknown_axis = {**WORKLOAD, "uuid": "w2", "axes": {"n": 4, "m": 2}}
        bad = write_problem(tmp_path / "bad", workloads=(WORKLOAD, unknown_axis))
    else:
        bad = write_problem(tmp_path / "bad")
        (bad / "solutions").mkdir()
        write_json(bad / "solutions" / "pytorch_seed.json", solution_json("other", "def run(x, w, y):\n    pass\n"))
    ran = kernelswarm("problems", "validate", good, bad)
    assert ran.code == 1
    assert f"FAIL {bad}" in ran.stderr
    assert message.format(bad=bad) in ran.stderr
    assert "1 of 2 problems valid" in ran.stderr


def test_validate_folder_without_problems_exits_1(tmp_path: Path) -> None:
    ran = kernelswarm("problems", "validate", tmp_path)
    assert ran.code == 1
    assert f"FAIL {tmp_path}: no definition.json" in ran.stderr


def test_list_json(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KERNELSWARM_PROBLEMS_DIR", str(PROBLEMS))
    assert main(["problems", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    names = [r["name"] for r in rows]
    assert names == sorted(p.name for p in PROBLEMS.iterdir() if (p / "definition.json").exists())
    picked = {r["name"]: r for r in rows if r["name"] in ("llama31_8b_gemm_o_proj", "llama31_8b_rmsnorm")}
    assert [(r["op_type"], r["workloads"], r["seeds"]) for r in picked.values()] == [("gemm", 6, 2), ("rmsnorm", 6, 3)]
    assert all(r["seeds"] >= 1 and r["workloads"] >= 6 and Path(r["path"]).parent == PROBLEMS for r in rows)


def test_list_json_of_an_empty_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KERNELSWARM_PROBLEMS_DIR", str(tmp_path))
    assert main(["problems", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_list_missing_folder_exits_2(tmp_path: Path) -> None:
    ran = kernelswarm("problems", "list", "--json", KERNELSWARM_PROBLEMS_DIR=str(tmp_path / "nowhere"))
    assert ran.code == 2
    assert f"error: {tmp_path / 'nowhere'}: no such problem folder" in ran.stderr


def test_no_command_prints_help_and_exits_2() -> None:
    ran = kernelswarm()
    assert ran.code == 2
    assert "usage: kernelswarm" in ran.stdout


def test_validate_refuses_a_workload_over_the_size_budget_naming_its_tensors(tmp_path: Path) -> None:
    """A const axis of 2**31 (issue 25): three float32 tensors of 8 GiB each, over the 16 GiB default;
    the same folder passes under a budget raised through the setting."""
    huge = {**DEFINITION, "axes": {"n": {"type": "var"}, "k": {"type": "const", "value": 2**31}},
            "inputs": {"x": {"shape": ["k"], "dtype": "float32"}, "w": {"shape": ["n"], "dtype": "float32"}},
            "outputs": {"y": {"shape": ["k"], "dtype": "float32"}}}
    folder = write_problem(tmp_path / "huge", huge)
    ran = kernelswarm("problems", "validate", folder)
    assert ran.code == 1
    assert f"FAIL {folder}" in ran.stderr
    text = flat(ran.stderr)
    assert "workload 1 (scale-8): its tensors take 17,179,869,216 bytes (16.00 GiB), over the budget of " \
           "17,179,869,184 bytes (16.00 GiB)" in text
    assert "`x` 8,589,934,592 bytes (8.00 GiB)" in text and "`y` 8,589,934,592 bytes" in text
    raised = kernelswarm("problems", "validate", folder, KERNELSWARM_MAX_WORKLOAD_BYTES=str(32 << 30))
    assert raised.code == 0, raised.stderr


def test_eval_keeps_the_references_compile_baselines_in_the_homes_db(tmp_path, capsys):
    """On a GPU `eval` measures T_b's torch.compile half once per (problem, workload, GPU kind); the
    next `eval` of the problem reads it from the home's DB (here the plumbing, on the CPU's name)."""
    from kernelswarm.cli import _BaselineCache

    settings = Settings(home=tmp_path)
    problem = load_problem(RMSNORM, with_seeds=False)
    first = _BaselineCache(settings, problem, "cpu")
    assert first.cached == {} and first.missing(problem.workloads[:2])
    first.store({problem.workloads[0].uuid: 1.25, problem.workloads[1].uuid: None})  # None: did not compile
    assert "not measured again" not in capsys.readouterr().err

    again = _BaselineCache(settings, problem, "cpu")
    assert again.cached == {problem.workloads[0].uuid: 1.25, problem.workloads[1].uuid: None}
    # Every workload evaluated has its figure: the reference is not compiled and timed again.
    assert not again.missing(problem.workloads[:2])
    assert "torch.compile baselines of the 2 workloads" in " ".join(capsys.readouterr().err.split())
    # One without: all are timed again, and stderr says why.
    assert again.missing(problem.workloads[:3])
    assert "2 of 3 workloads cached" in " ".join(capsys.readouterr().err.split())
    again.store({problem.workloads[0].uuid: 9.0})  # measured again by mistake: the first figure stays
    assert _BaselineCache(settings, problem, "cpu").cached[problem.workloads[0].uuid] == 1.25

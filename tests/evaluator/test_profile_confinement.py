"""What the profiled process runs under (`tools.profile._run_ncu`), checked with a stand-in for
ncu: a small program of ours at ncu's place in the command, which looks at the world it was given,
writes what it saw, and prints a raw CSV page as ncu would. Where the evaluator runs as root (CI
does), it must see a network with only its loopback, up; write its own folder only; and the page
it wrote must come back as the profile's text. Not as root, only the limits and the text apply."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest

from services.evaluator.config import EvalConfig
from services.evaluator.evaluate import AttemptResult
from services.evaluator.languages.build import Build
from services.evaluator.timer.plan import Plan
from services.evaluator.timer.route import Routed
from services.evaluator.tools import profile
from services.evaluator.tools.profile import _Kept, _run_ncu
from shared.schema import Correctness, Environment, Performance, Status, Trace, load_problem
from shared.schema import Evaluation as Evaluation_
from test_profile_text import page

PROBLEMS = Path(__file__).resolve().parents[2] / "problems"
PROBLEM = load_problem(PROBLEMS / "llama31_8b_rmsnorm")

STAND_IN = '''#!{python}
import fcntl, json, os, resource, socket, struct, sys
args = sys.argv[1:]
log = args[args.index("--log-file") + 1]
home = os.path.dirname(log)
seen = {{"argv": args, "names": [name for _index, name in socket.if_nameindex()]}}
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    flags = struct.unpack("16sh", fcntl.ioctl(s, 0x8913, struct.pack("16sh", b"lo", 0)))[1]
seen["lo_up"] = bool(flags & 1)
for where in (os.path.dirname(home), {repo!r}):
    try:
        with open(os.path.join(where, "written-by-profile"), "w") as f:
            f.write("x")
        seen[where] = "written"
    except OSError as error:
        seen[where] = error.strerror
with open(os.path.join(home, "mine"), "w") as f:
    f.write("x")
seen["own"] = "written"
seen["nofile"] = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
seen["environ"] = sorted(os.environ)
with open(os.path.join(home, "seen.json"), "w") as f:
    json.dump(seen, f)
with open(log, "w") as f:
    f.write({page!r})
'''


def run_stand_in(tmp_path: Path) -> tuple[tuple, dict]:
    folder = tmp_path / "prof"
    folder.mkdir()
    tool = folder / "ncu"
    repo = str(Path(__file__).resolve().parents[2])
    tool.write_text(STAND_IN.format(python=sys.executable, repo=repo, page=page()))
    tool.chmod(0o755)
    kept = _Kept(plan={"steps": []}, cubin=b"\x7fELF not a real one")
    problem = dataclasses.replace(PROBLEM, workloads=PROBLEM.workloads[:1])
    done = _run_ncu(folder, problem, PROBLEM.seed("cuda"), EvalConfig(device="cuda:0"), kept, str(tool), 3350.0)
    seen = json.loads((folder / "home" / "seen.json").read_text())
    return done, seen


def test_the_page_ncu_wrote_comes_back_as_the_profile_text(tmp_path):
    (status, text), seen = run_stand_in(tmp_path)
    assert status is None, text
    assert "one call: 2 launches" in text and "DRAM 85.0% (2848 of 3350 GB/s)" in text
    argv = seen["argv"]
    assert argv[argv.index("--profile-from-start") + 1] == "off"
    assert argv[-3:-1] == ["-m", "services.evaluator.tools.target"] and argv[-1].endswith("job.json")
    job = json.loads(Path(argv[-1]).read_text())  # the target's job, beside its home
    assert job["workload"]["uuid"] == PROBLEM.workloads[0].uuid and job["cubin_path"].endswith("kernels.cubin")
    assert seen["nofile"] == 4096  # the sandbox's limits
    assert "OPENAI_API_KEY" not in seen["environ"] and set(seen["environ"]) <= {
        "PATH", "HOME", "TMPDIR", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED", "CUDA_VISIBLE_DEVICES",
        "LD_LIBRARY_PATH", "CUDA_HOME", "OMP_NUM_THREADS", "LANG", "LC_CTYPE"}


@pytest.mark.skipif(os.geteuid() != 0, reason="the network namespace and the private view need root")
def test_as_root_it_has_its_own_loopback_and_writes_its_own_folder_only(tmp_path):
    (_status, _text), seen = run_stand_in(tmp_path)
    assert seen["names"] == ["lo"] and seen["lo_up"]
    assert seen["own"] == "written"
    repo = str(Path(__file__).resolve().parents[2])
    assert seen[str(tmp_path / "prof")] != "written" and seen[repo] != "written"
    assert not (Path(repo) / "written-by-profile").exists() and not (tmp_path / "prof" / "written-by-profile").exists()


class Evaluation:
    """Stands in for `evaluate` in `profile_workload`: calls the probe as the record step would
    (with `routed`, or not at all), then returns `status` with a median of 0.05 ms."""

    def __init__(self, cubin: Path, routed=None, status: Status = Status.PASSED) -> None:
        self.cubin, self.routed, self.status, self.given = cubin, routed, status, []

    def __call__(self, problem, solution, config, *args, **kwargs) -> AttemptResult:
        self.given.append((tuple(w.uuid for w in problem.workloads), config.measure_compile))
        if self.routed is not None:
            config.probe(self.routed, Build(None, "", self.cubin.parent, {}, self.cubin))
        workload = problem.workloads[0]
        performance = Performance(latency_ms=0.05, reference_latency_ms=0.1, speedup_factor=2.0) \
            if self.status is Status.PASSED else None
        trace = Trace(definition=problem.name, workload=workload, solution=solution.name, evaluation=Evaluation_(
            status=self.status, environment=Environment(hardware="test"), timestamp="now", log="",
            performance=performance,
            correctness=Correctness(max_absolute_error=0.0, max_relative_error=0.0)
            if self.status in (Status.PASSED, Status.INCORRECT_NUMERICAL) else None))
        return AttemptResult(self.status, [trace], 0.05 if performance else None, None, 1, "nvcc: error here"
                             if self.status is Status.COMPILE_ERROR else "")


@pytest.fixture
def stand_in_ncu(tmp_path, monkeypatch) -> Path:
    tool = tmp_path / "tools" / "ncu"
    tool.parent.mkdir()
    tool.write_text(STAND_IN.format(python=sys.executable, repo=str(tmp_path / "elsewhere"), page=page()))
    tool.chmod(0o755)
    monkeypatch.setattr(profile, "find_ncu", lambda: str(tool))
    return tool


def one_workload():
    return dataclasses.replace(PROBLEM, workloads=PROBLEM.workloads[1:2])


def test_the_replayed_plan_is_profiled_beside_the_evaluations_verdict(tmp_path, monkeypatch, stand_in_ncu):
    cubin = tmp_path / "kernels.cubin"
    cubin.write_bytes(b"\x7fELF")
    uuid = PROBLEM.workloads[1].uuid
    stand_in = Evaluation(cubin, Routed(plans={uuid: Plan()}))
    monkeypatch.setattr(profile, "evaluate", stand_in)
    done = profile.profile_workload(one_workload(), PROBLEM.seed("cuda"), EvalConfig(device="cuda:0"), 3350.0, "GPU X")
    assert done.status is None, done.text
    assert done.text.startswith(f"profile of workload {uuid} (num_tokens=8) on GPU X, Nsight Compute\n"
                                "the evaluator's own run of this workload: PASSED, median 0.05 ms")
    assert "one call: 2 launches" in done.text and done.latency_ms == 0.05
    assert stand_in.given == [((uuid,), False)]  # its one workload; no torch.compile measured for it


def test_launches_that_were_not_replayed_are_unsupported_with_the_reason(tmp_path, monkeypatch, stand_in_ncu):
    stand_in = Evaluation(tmp_path / "kernels.cubin", Routed(reason="not replayed: tensor work on the host"))
    monkeypatch.setattr(profile, "evaluate", stand_in)
    done = profile.profile_workload(one_workload(), PROBLEM.seed("cuda"), EvalConfig(device="cuda:0"))
    assert done.status is Status.UNSUPPORTED and "tensor work on the host" in done.text


def test_an_evaluation_that_fails_before_its_plan_gives_its_own_status(tmp_path, monkeypatch, stand_in_ncu):
    monkeypatch.setattr(profile, "evaluate", Evaluation(tmp_path / "k", None, Status.COMPILE_ERROR))
    done = profile.profile_workload(one_workload(), PROBLEM.seed("cuda"), EvalConfig(device="cuda:0"))
    assert done.status is Status.COMPILE_ERROR and "nvcc: error here" in done.text


def test_without_ncu_nothing_runs(monkeypatch):
    monkeypatch.setattr(profile, "find_ncu", lambda: None)
    monkeypatch.setattr(profile, "evaluate", lambda *a, **k: pytest.fail("evaluated without ncu"))
    done = profile.profile_workload(one_workload(), PROBLEM.seed("cuda"), EvalConfig(device="cuda:0"))
    assert done.status is Status.UNSUPPORTED and "ncu" in done.text
    two = dataclasses.replace(PROBLEM, workloads=PROBLEM.workloads[:2])
    assert "one workload" in profile.profile_workload(two, PROBLEM.seed("cuda"), EvalConfig(device="cuda:0")).text


def test_a_machine_whose_ncu_reads_no_counters_is_unsupported_not_the_kernels_fault(tmp_path):
    folder = tmp_path / "prof"
    folder.mkdir()
    tool = folder / "ncu"
    tool.write_text(f"#!{sys.executable}\nimport sys\n"
                    "print('==PROF== Connected to process 77')\n"
                    "print('==ERROR== Failed to initialize the profiler: LibraryNotLoaded')\nsys.exit(1)\n")
    tool.chmod(0o755)
    kept = _Kept(plan={"steps": []}, cubin=b"\x7fELF")
    problem = dataclasses.replace(PROBLEM, workloads=PROBLEM.workloads[:1])
    status, text = _run_ncu(folder, problem, PROBLEM.seed("cuda"), EvalConfig(device="cuda:0"), kept, str(tool), None)
    assert status is Status.UNSUPPORTED and "LibraryNotLoaded" in text


@pytest.mark.parametrize("status", [Status.TIMEOUT, Status.RUNTIME_ERROR, Status.REWARD_HACK])
def test_kernels_that_hung_crashed_or_cheated_are_not_run_again_under_ncu(tmp_path, monkeypatch, status):
    uuid = PROBLEM.workloads[1].uuid
    monkeypatch.setattr(profile, "evaluate", Evaluation(tmp_path / "k", Routed(plans={uuid: Plan()}), status))
    monkeypatch.setattr(profile, "find_ncu", lambda: "/bin/false")
    monkeypatch.setattr(profile, "_run_ncu", lambda *args: pytest.fail("profiled after " + status.value))
    (tmp_path / "k").write_bytes(b"\x7fELF")
    done = profile.profile_workload(one_workload(), PROBLEM.seed("cuda"), EvalConfig(device="cuda:0"))
    assert done.status is status


def test_a_kernel_with_wrong_values_is_still_profiled_and_said_so(tmp_path, monkeypatch, stand_in_ncu):
    cubin = tmp_path / "kernels.cubin"
    cubin.write_bytes(b"\x7fELF")
    uuid = PROBLEM.workloads[1].uuid
    monkeypatch.setattr(profile, "evaluate", Evaluation(cubin, Routed(plans={uuid: Plan()}),
                                                        Status.INCORRECT_NUMERICAL))
    done = profile.profile_workload(one_workload(), PROBLEM.seed("cuda"), EvalConfig(device="cuda:0"))
    assert done.status is None and "INCORRECT_NUMERICAL (figures of a kernel that did not pass)" in done.text

"""The catalogue of bad kernels: each solution goes through the whole evaluator (build, reference
child, candidate child, checks) on a tiny problem and must get its status.

An attempt costs two child processes that import torch (~2 s each), so the attempts a session
selects are started together when the first one is needed and run two at a time; each test then
checks its own attempt. Every test here takes a `case` parameter, which is how the runner knows
which attempts the session selected.
"""

from __future__ import annotations

import json
import socket
import shutil
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from evalkit import (
    FAST, PROBLEMS_DIR, TOLERANCE, affine_definition, affine_workloads, lock_is_free, make_problem, make_solution,
)
from services.evaluator.evaluate import AttemptResult, evaluate
from services.evaluator.sandbox.isolation import WRITABLE_ENV, isolation
from shared.schema import Problem, Status, Trace, load_problem

WORKERS = 2
HANG_TIMEOUT_S = 5.0
PARENT_SECRET = "KERNELSWARM_TEST_PARENT_SECRET"
SEEDS = ("llama31_8b_gemm_o_proj", "llama31_8b_rmsnorm", "llama31_8b_swiglu")

AFFINE = "import torch\n\ndef run(x, w, b, y):\n    y.copy_(x * w + b)\n"


@dataclass(frozen=True)
class Case:
    id: str
    status: Status
    code: str | None  # None: the problem's seed solution
    problem: str = "affine_float32"
    solution: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    max_workloads: int | None = None


CASES = [
    # Slow ones first, so that they overlap with the rest.
    Case("hang", Status.TIMEOUT, """
        import fcntl
        import os

        def run(x, w, b, y):  # its pid is its PID namespace's: the lock it holds says it lives
            lock = os.open("@TMP@/hang.lock", os.O_RDWR | os.O_CREAT, 0o666)
            fcntl.flock(lock, fcntl.LOCK_EX)
            while True:
                pass
        """, config={"attempt_timeout_s": HANG_TIMEOUT_S}),
    *[Case(f"seed_{name}", Status.PASSED, None, problem=name, max_workloads=2) for name in SEEDS],
    Case("correct_float32", Status.PASSED, AFFINE),
    Case("correct_bfloat16", Status.PASSED, AFFINE, problem="affine_bfloat16"),
    Case("correct_returning", Status.PASSED, """
        def run(x, w, b):
            return x * w + b
        """, solution={"dps": False}),
    Case("wrong_values", Status.INCORRECT_NUMERICAL, """
        def run(x, w, b, y):
            y.copy_(x * w + b)
            y[1, 5] += 1.0
        """),
    Case("unwritten_output", Status.INCORRECT_NUMERICAL, """
        def run(x, w, b, y):
            return None
        """),
    Case("half_written", Status.INCORRECT_NUMERICAL, """
        def run(x, w, b, y):
            half = y.shape[0] // 2
            y[:half] = x[:half] * w + b
        """),
    Case("wrong_shape", Status.INCORRECT_SHAPE, """
        def run(x, w, b):
            return (x * w + b).flatten()
        """, solution={"dps": False}),
    Case("wrong_dtype", Status.INCORRECT_DTYPE, """
        def run(x, w, b):
            return (x * w + b).double()
        """, solution={"dps": False}),
    Case("syntax_error", Status.COMPILE_ERROR, """
        import torch

        def run(x, w, b, y)
            y.copy_(x * w + b)
        """),
    Case("raises", Status.RUNTIME_ERROR, """
        def _launch(x):
            raise ValueError(f"kernel exploded on {tuple(x.shape)}")

        def run(x, w, b, y):
            _launch(x)
        """),
    Case("exits", Status.RUNTIME_ERROR, """
        import os

        def run(x, w, b, y):
            os._exit(3)
        """),
    Case("segfault", Status.RUNTIME_ERROR, """
        import ctypes

        def run(x, w, b, y):
            ctypes.string_at(0)
        """),
    Case("garbage_after_correctness_rounds", Status.INCORRECT_NUMERICAL, f"""
        CALLS = [0]

        def run(x, w, b, y):
            CALLS[0] += 1
            if CALLS[0] <= {FAST.correctness_rounds}:
                y.copy_(x * w + b)
            else:
                y.zero_()
        """),
    # Computes each input set once, then skips the work when it sees the same values again,
    # counting on the output buffer still holding the earlier result. No checked or timed call
    # repeats a set (every timed run has its own; only the unchecked, untimed warm-up repeats the
    # last correctness round), so it computes every one of them and its time is honest.
    Case("skip_seen_inputs", Status.PASSED, """
        SEEN = set()

        def run(x, w, b, y):
            key = (tuple(x.shape), x.flatten()[:4].tolist(), w[:4].tolist())
            key = repr(key)
            if key in SEEN:
                return
            SEEN.add(key)
            y.copy_(x * w + b)
        """),
    # Remembers the first answer per shape: fooled by the fresh values of the next round.
    Case("memo_by_shape", Status.INCORRECT_NUMERICAL, """
        MEMO = {}

        def run(x, w, b, y):
            key = tuple(x.shape)
            if key not in MEMO:
                MEMO[key] = x * w + b
            y.copy_(MEMO[key])
        """),
    Case("ignores_weight", Status.INCORRECT_NUMERICAL, """
        def run(x, w, b, y):
            y.copy_(x + b)
        """),
    Case("triton_on_cpu", Status.UNSUPPORTED, AFFINE, solution={"language": "triton"}),
    Case("cuda_on_cpu", Status.UNSUPPORTED, "extern \"C\" __global__ void run() {}\n",
         solution={"language": "cuda", "entry": "kernel.cu::run"}),
    Case("reference_raises", Status.INVALID_REFERENCE, AFFINE, problem="bad_reference"),
    Case("safetensors_missing", Status.INVALID_REFERENCE, AFFINE, problem="safetensors_missing"),
    Case("safetensors", Status.PASSED, AFFINE, problem="safetensors"),
    Case("scalar_inputs", Status.PASSED, """
        import torch

        def run(x, alpha, y):
            if type(alpha) is not float:
                raise TypeError(f"alpha is a {type(alpha).__name__}")
            torch.mul(x, alpha, out=y)
        """, problem="scalar"),
    Case("custom_inputs", Status.PASSED, """
        import torch

        def run(idx, table, y):
            torch.index_select(table, 0, idx, out=y)
        """, problem="custom"),
    Case("tunable_chosen", Status.PASSED, """
        def run(x, w, b, y):
            y.copy_((x * w + b) * (SCALE / 2))
        """, solution={"tunables": {"SCALE": [1, 2]}, "tunable_values": {"SCALE": 2}}),
    Case("tunable_default", Status.INCORRECT_NUMERICAL, """
        def run(x, w, b, y):
            y.copy_((x * w + b) * (SCALE / 2))
        """, solution={"tunables": {"SCALE": [1, 2]}}),
    # Guards: each of these is a cheat, caught in the child and reported as REWARD_HACK.
    Case("patches_timer", Status.REWARD_HACK, """
        import time

        _real = time.perf_counter
        time.perf_counter = lambda: _real() * 0.5  # halves every measured time

        def run(x, w, b, y):
            y.copy_(x * w + b)
        """),
    Case("patches_harness", Status.REWARD_HACK, """
        import sys

        def run(x, w, b, y):
            y.copy_(x * w + b)
            timing = sys.modules["services.evaluator.harness.timing"]
            timing._time_on_host = lambda *args, **kwargs: None
        """),
    Case("leaves_a_thread_running", Status.REWARD_HACK, """
        import threading
        import time

        def _background():
            time.sleep(30)

        def run(x, w, b, y):
            threading.Thread(target=_background, daemon=True, name="helper").start()
            y.copy_(x * w + b)
        """),
    Case("starts_a_process", Status.REWARD_HACK, """
        import subprocess

        def run(x, w, b, y):
            subprocess.Popen(["sleep", "30"])
            y.copy_(x * w + b)
        """),
    Case("mutates_input", Status.REWARD_HACK, """
        def run(x, w, b, y):
            y.copy_(x * w + b)
            x.zero_()
        """),
    Case("returns_a_tensor_subclass", Status.REWARD_HACK, """
        import torch

        class Lazy(torch.Tensor):
            pass

        def run(x, w, b):
            return (x * w + b).as_subclass(Lazy)
        """, solution={"dps": False}),
    Case("forges_the_result_channel", Status.REWARD_HACK, """
        import atexit
        import json
        from pathlib import Path

        FAKE = {"workloads": [{"uuid": "made-up", "status": "OK",
                               "latency": {"median_ms": 1e-6, "min_ms": 1e-6, "max_ms": 1e-6, "runs": 3}}] * 2}
        # Written after the harness's last honest write, as the process exits.
        atexit.register(lambda: Path("result.json").write_text(json.dumps(FAKE)))

        def run(x, w, b, y):
            y.copy_(x * w + b)
        """),
    # Reports what the candidate's process can see, once, to a file the test reads.
    Case("probe", Status.PASSED, """
        import json
        import os
        import socket
        import sys
        from pathlib import Path

        def _parent_environ_readable():
            try:
                return len(Path(f"/proc/{os.getppid()}/environ").read_bytes()) > 0
            except OSError:
                return False

        def _can_connect():
            try:
                socket.create_connection(("127.0.0.1", @PORT@), timeout=2).close()
                return True
            except OSError:
                return False

        def _listing(folder):
            try:
                return sorted(p.name for p in folder.iterdir())
            except PermissionError:  # as `nobody`: the attempt folder is enterable, not listable
                return None

        def run(x, w, b, y):
            y.copy_(x * w + b)
            report_path = Path("@TMP@/probe.json")
            if report_path.exists():
                return
            here = Path.cwd()
            report = {
                "parent_environ_readable": _parent_environ_readable(),
                "network": _can_connect(),
                "kernelswarm_env": sorted(k for k in os.environ if k.startswith("KERNELSWARM_")),
                "home": os.environ.get("HOME"),
                "tmpdir": os.environ.get("TMPDIR"),
                "cwd": str(here),
                "reference_modules": sorted(name for name, module in list(sys.modules.items())
                                            if name == "reference"
                                            or getattr(module, "__file__", None) == "<reference>"),
                "attempt_dirs": _listing(here.parent),
                "ref_there": any((here.parent / name).exists() for name in ("ref", "expected")),
            }
            report_path.write_text(json.dumps(report))
        """),
]
CASES_BY_ID = {case.id: case for case in CASES}


def cases(*ids: str) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("case", [CASES_BY_ID[i] for i in ids], ids=list(ids))


@dataclass(frozen=True)
class Ran:
    result: AttemptResult
    wall_s: float


class Attempts:
    """The selected cases, evaluated `WORKERS` at a time in the background."""

    def __init__(self, problems: dict[str, Problem], tmp: Path, port: int, selected: list[Case], drop: Path) -> None:
        self.problems, self.tmp, self.port, self.drop = problems, tmp, port, drop
        self._pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="attempt")
        self._futures: dict[str, Future[Ran]] = {c.id: self._pool.submit(self._run, c) for c in selected}

    def __getitem__(self, case: Case) -> Ran:
        return self._futures[case.id].result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(self.drop, ignore_errors=True)

    def _run(self, case: Case) -> Ran:
        problem = self.problems[case.problem]
        if case.code is None:
            solution = problem.seed("pytorch")
        else:
            code = case.code.replace("@TMP@", str(self.drop)).replace("@PORT@", str(self.port))
            solution = make_solution(code, problem.name, name=case.id, **case.solution)
        started = time.monotonic()
        result = evaluate(problem, solution, replace(FAST, **case.config), case.max_workloads)
        return Ran(result, time.monotonic() - started)


def _problems(root: Path) -> dict[str, Problem]:
    problems = {f"affine_{dtype}": make_problem(root, affine_definition(dtype), affine_workloads(dtype))
                for dtype in ("float32", "bfloat16")}
    problems["bad_reference"] = make_problem(root, affine_definition(
        name="bad_reference",
        reference="import torch\n\ndef run(x, w, b):\n    raise RuntimeError('reference is broken')\n",
    ), affine_workloads())

    from_file = {"x": {"type": "random"}, "b": {"type": "random"},
                 "w": {"type": "safetensors", "path": "data/w.safetensors", "tensor_key": "w"}}
    folder = make_problem(root, affine_definition(name="safetensors"), affine_workloads(inputs=from_file)).root
    (folder / "data").mkdir()
    save_file({"w": torch.linspace(-2.0, 2.0, 16)}, str(folder / "data" / "w.safetensors"))
    problems["safetensors"] = load_problem(folder, with_seeds=False)
    problems["safetensors_missing"] = make_problem(root, affine_definition(name="safetensors_missing"),
                                                   affine_workloads(inputs=from_file))

    problems["scalar"] = make_problem(root, {
        "name": "scalar",
        "axes": {"n": {"type": "var"}},
        "inputs": {"x": {"shape": ["n"], "dtype": "float32"}, "alpha": {"shape": None, "dtype": "float32"}},
        "outputs": {"y": {"shape": ["n"], "dtype": "float32"}},
        "reference": "def run(x, alpha):\n    return x * alpha\n",
    }, [{"uuid": f"scalar-{i}", "axes": {"n": 5 + i}, "inputs": {"x": {"type": "random"},
         "alpha": {"type": "scalar", "value": alpha}}, "tolerance": TOLERANCE["float32"]}
        for i, alpha in enumerate((2.5, -0.75))])

    problems["custom"] = make_problem(root, {
        "name": "custom",
        "axes": {"n": {"type": "var"}, "v": {"type": "const", "value": 10}, "d": {"type": "const", "value": 4}},
        "custom_inputs_entrypoint": "get_inputs",
        "inputs": {"idx": {"shape": ["n"], "dtype": "int64"}, "table": {"shape": ["v", "d"], "dtype": "float32"}},
        "outputs": {"y": {"shape": ["n", "d"], "dtype": "float32"}},
        "reference": (
            "import torch\n\n"
            "def get_inputs(axes, device):\n"
            "    idx = torch.randint(0, 10, (axes['n'],), device=device)\n"
            "    return {'idx': idx, 'table': torch.randn(10, 4, device=device)}\n\n"
            "def run(idx, table):\n"
            "    return table[idx]\n"
        ),
    }, [{"uuid": f"custom-{n}", "axes": {"n": n}, "inputs": {"idx": {"type": "custom"}, "table": {"type": "custom"}}}
        for n in (3, 9)])

    for name in SEEDS:
        problems[name] = load_problem(PROBLEMS_DIR / name)
    return problems


@pytest.fixture(scope="module")
def attempts(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Attempts]:
    params = [getattr(getattr(item, "callspec", None), "params", {})
              for item in request.session.items if item.module is request.module]
    selected = {p["case"].id for p in params if "case" in p}
    tmp = tmp_path_factory.mktemp("catalogue")
    with pytest.MonkeyPatch.context() as env, socket.create_server(("127.0.0.1", 0)) as listener:
        env.setenv(PARENT_SECRET, "the parent's secret")
        env.setenv("OMP_NUM_THREADS", "1")  # two children at a time on a small machine
        # A drop box the candidate can write whoever it runs as (the sandbox may make it `nobody`),
        # left writable in its otherwise read-only view.
        drop = Path(tempfile.mkdtemp(prefix="ks-probe-", dir="/tmp"))
        drop.chmod(0o777)
        env.setenv(WRITABLE_ENV, str(drop))
        runner = Attempts(_problems(tmp / "problems"), tmp, listener.getsockname()[1],
                          [c for c in CASES if c.id in selected], drop)
        try:
            yield runner
        finally:
            runner.close()


# --- every case gets its status, on every workload ------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_status(attempts: Attempts, case: Case) -> None:
    result = attempts[case].result
    assert result.status is case.status, result.message
    workloads = case.max_workloads or 2
    assert len(result.traces) == workloads
    assert [t.evaluation.status for t in result.traces] == [case.status] * workloads
    assert result.workloads_passed == (workloads if case.status is Status.PASSED else 0)
    for trace in result.traces:  # every trace is a valid SOL-ExecBench Trace, also after a JSON round trip
        assert Trace.model_validate_json(trace.model_dump_json()) == trace
        if case.code is not None:
            assert trace.solution == case.id
    if case.status is not Status.PASSED:
        assert result.message.strip()
        assert result.latency_ms is None and result.speedup is None


# --- what a verdict carries ------------------------------------------------------------------------


@cases("correct_float32", "correct_bfloat16", "correct_returning")
def test_passed_has_performance_and_correctness(attempts: Attempts, case: Case) -> None:
    result = attempts[case].result
    assert result.latency_ms is not None and result.latency_ms > 0
    assert result.speedup is not None and result.speedup > 0
    assert result.message == ""
    assert [t.workload.uuid for t in result.traces] == ["affine-n3", "affine-n7"]
    for trace in result.traces:
        evaluation = trace.evaluation
        assert trace.definition == case.problem
        assert evaluation.log == "" or evaluation.log.startswith("charged")
        assert evaluation.environment.hardware.startswith("CPU")
        assert evaluation.environment.libs["torch"] == torch.__version__
        tolerance = trace.workload.tolerance
        assert 0 <= evaluation.correctness.max_absolute_error <= tolerance.max_atol + 1e-6
        assert evaluation.correctness.extra == {"matched_ratio": 1.0}
        performance = evaluation.performance
        assert performance.latency_ms > 0 and performance.reference_latency_ms > 0
        assert performance.speedup_factor == pytest.approx(performance.reference_latency_ms / performance.latency_ms)
        timing = evaluation.timing  # the outer clock (on for CPU devices) leaves its figures on the trace
        assert timing.outer_allowed_ms is not None and timing.outer_window_ms > 0 and len(timing.load_avg) == 3
        # Its last window within its allowance, or (a loaded machine) charged the outer clock's figure.
        charged = timing.outer_charged_ms is not None
        assert (timing.outer_window_ms <= timing.outer_allowed_ms) is not charged
        assert performance.latency_ms == (timing.outer_charged_ms if charged else timing.median_ms)


@cases("wrong_values")
def test_numerical_message_names_output_and_worst_element(attempts: Attempts, case: Case) -> None:
    result = attempts[case].result
    assert "correctness round 0" in result.message
    assert "output `y`" in result.message
    assert "worst at [1, 5]" in result.message
    for trace in result.traces:
        correctness = trace.evaluation.correctness
        assert correctness is not None and trace.evaluation.performance is None
        assert correctness.max_absolute_error == pytest.approx(1.0, abs=1e-5)
        assert correctness.extra["matched_ratio"] < 1.0


@cases("unwritten_output", "half_written")
def test_unwritten_elements_stay_nan(attempts: Attempts, case: Case) -> None:
    result = attempts[case].result
    assert "got nan" in result.message
    if case.id == "half_written":  # rows 0..n//2-1 are right, the first unwritten row is the worst
        assert "worst at [1, 0]" in result.message
        assert 0 < result.traces[0].evaluation.correctness.extra["matched_ratio"] < 1


@cases("wrong_shape", "wrong_dtype")
def test_shape_and_dtype_messages(attempts: Attempts, case: Case) -> None:
    message = attempts[case].result.message
    if case.id == "wrong_shape":
        assert "output `y` has shape (48,), expected (3, 16)" in message
    else:
        assert "output `y` has dtype torch.float64, expected torch.float32" in message
    assert all(t.evaluation.correctness is None for t in attempts[case].result.traces)


@cases("syntax_error")
def test_compile_error_names_the_line(attempts: Attempts, case: Case) -> None:
    message = attempts[case].result.message
    assert message.startswith("main.py:3:")
    assert "def run(x, w, b, y)" in message


@cases("raises")
def test_runtime_error_keeps_the_traceback(attempts: Attempts, case: Case) -> None:
    message = attempts[case].result.message
    assert "Traceback (most recent call last)" in message
    assert "main.py" in message and "_launch" in message
    assert "ValueError: kernel exploded on (3, 16)" in message


@cases("exits", "segfault")
def test_a_dying_child_is_a_runtime_error(attempts: Attempts, case: Case) -> None:
    code = 3 if case.id == "exits" else -11  # SIGSEGV
    assert f"the solution exited with code {code} before finishing" in attempts[case].result.message


@cases("hang")
def test_a_hang_is_killed(attempts: Attempts, case: Case) -> None:
    ran = attempts[case]
    assert f"ran past {HANG_TIMEOUT_S:.0f} s and was killed" in ran.result.message
    lock = attempts.drop / "hang.lock"
    assert lock.exists(), "the candidate never took its lock"
    assert lock_is_free(lock), "the hung candidate is still running"



@cases("garbage_after_correctness_rounds")
def test_timed_runs_outputs_are_checked(attempts: Attempts, case: Case) -> None:
    assert attempts[case].result.message.startswith("timed run on input set")


@cases("memo_by_shape")
def test_every_round_has_fresh_inputs(attempts: Attempts, case: Case) -> None:
    assert attempts[case].result.message.startswith("correctness round 1:")


@cases("triton_on_cpu", "cuda_on_cpu")
def test_unsupported_language_says_why(attempts: Attempts, case: Case) -> None:
    language = case.solution["language"]
    assert f"language {language} does not run on device cpu" in attempts[case].result.message


@cases("reference_raises")
def test_reference_error_is_not_the_candidates(attempts: Attempts, case: Case) -> None:
    message = attempts[case].result.message
    assert "the reference raised" in message and "RuntimeError: reference is broken" in message


@cases("safetensors_missing")
def test_missing_safetensors_names_the_path(attempts: Attempts, case: Case) -> None:
    message = attempts[case].result.message
    missing = attempts.tmp / "problems" / "safetensors_missing" / "data" / "w.safetensors"
    assert f"safetensors file not found: {missing}" in message
    assert "'w'" in message


@cases("tunable_default")
def test_tunable_defaults_to_first_value(attempts: Attempts, case: Case) -> None:
    # SCALE = 1 halves every element: the kernel only ran with the injected default.
    correctness = attempts[case].result.traces[0].evaluation.correctness
    assert correctness.extra["matched_ratio"] < 0.5


@cases("probe")
def test_candidate_runs_apart_from_the_reference_and_the_parent(attempts: Attempts, case: Case) -> None:
    report = json.loads((attempts.drop / "probe.json").read_text())
    assert report["kernelswarm_env"] == []  # the parent had PARENT_SECRET set while it ran
    assert report["home"] == report["tmpdir"] == report["cwd"]  # private home and temp dir
    assert report["reference_modules"] == []
    # By the time the candidate runs, the reference's job (with the seed) and the expected outputs
    # are no longer on disk where it could read them.
    assert report["ref_there"] is False
    if report["attempt_dirs"] is not None:  # None: not listable (the candidate runs as `nobody`)
        assert "expected" not in report["attempt_dirs"] and "ref" not in report["attempt_dirs"]
        assert {"cand", "inputs", "outputs"} <= set(report["attempt_dirs"])


# Known gaps of the CPU sandbox (DESIGN: "a scrubbed environment, no network"): the candidate runs as
# the evaluator's user in its network namespace. These flip to XPASS, and fail, once closed.


@cases("probe")
@pytest.mark.skipif(not isolation()["unprivileged_user"],
                    reason="the candidate cannot run as `nobody` here (not root, or Python lives in a "
                           "folder `nobody` cannot read): it runs as the evaluator's user")
def test_candidate_cannot_read_the_parents_environment(attempts: Attempts, case: Case) -> None:
    report = json.loads((attempts.drop / "probe.json").read_text())
    assert report["parent_environ_readable"] is False


@cases("probe")
@pytest.mark.skipif(not isolation()["network_namespace"],
                    reason="this machine gives the evaluator no network namespace")
def test_candidate_has_no_network(attempts: Attempts, case: Case) -> None:
    report = json.loads((attempts.drop / "probe.json").read_text())
    assert report["network"] is False

"""The `profile` and `inspect` tools on a real GPU, through the real evaluator path: a scripted
writer session (`services.worker.diagnose`, its attempts answered by `record.evaluate_attempt` as
the evaluate task does) inspects and profiles a `cuda` solution, then evaluates it on the profiled
workload; the profile's kernel time is compared with the evaluator's timed median.

Run on the GPU machine (ncu and cuobjdump beside nvcc, as root for the GPU's counters):
`pytest -m gpu tests/gpu/test_diagnostic_tools_gpu.py -s` (-s prints the texts and both timings).
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import pytest
from sqlalchemy import select

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from services.evaluator.record import evaluate_attempt  # noqa: E402
from services.evaluator.tools.profile import find_ncu  # noqa: E402
from services.worker.diagnose import diagnose  # noqa: E402
from services.worker.write import Job  # noqa: E402
from shared.db import AttemptRow, TraceRow  # noqa: E402
from shared.repository import create_attempt, put_solution, upsert_problem  # noqa: E402
from shared.runtime import Runtime  # noqa: E402
from shared.schema import Solution, load_problem  # noqa: E402
from shared.settings import Settings  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BIG = 1 << 24  # 16M floats: 128 MiB read, 64 MiB written, tens of microseconds at HBM speed
KERNEL = r"""
extern "C" __global__ void scale(const float* __restrict__ x, const float* __restrict__ w,
                                 float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * w[i];
}
"""
LAUNCH = """
def run(x, w, y, *, kernels):
    n = y.numel()
    kernels.scale(x, w, y, n, grid=((n + 255) // 256,), block=(256,))
"""


@pytest.fixture(scope="module")
def problem(readable_tmp):
    root = Path(tempfile.mkdtemp(prefix="diag-", dir=readable_tmp))
    root.chmod(0o755)
    definition = {
        "name": "diag_scale", "op_type": "elementwise", "axes": {"n": {"type": "var"}},
        "inputs": {"x": {"shape": ["n"], "dtype": "float32"}, "w": {"shape": ["n"], "dtype": "float32"}},
        "outputs": {"y": {"shape": ["n"], "dtype": "float32"}},
        "reference": "import torch\n\n@torch.no_grad()\ndef run(x, w):\n    return x * w\n",
    }
    (root / "definition.json").write_text(json.dumps(definition))
    (root / "workload.jsonl").write_text("".join(json.dumps(
        {"uuid": f"w{n}", "axes": {"n": n}, "inputs": {"x": {"type": "random"}, "w": {"type": "random"}},
         "tolerance": {"max_atol": 1e-6, "max_rtol": 1e-6, "required_matched_ratio": 1.0}}) + "\n"
        for n in (1000, BIG)))
    return load_problem(root)


@pytest.fixture(scope="module")
def session(problem, tmp_path_factory):
    runtime = Runtime(Settings(home=tmp_path_factory.mktemp("home"), problems_dir=REPO / "problems", device="cuda",
                               calibrate=False, attempt_timeout_s=120.0))
    with runtime.db.session() as db:
        problem_id = upsert_problem(db, problem).id
    job = Job(assignment_id=None, campaign_id=None, problem_id=problem_id, problem_name=problem.name, device="cuda",
              remaining=10, made_before=0, language="cuda", parent_hash=None, guidance=None, seeds=(),
              workloads=tuple(w.uuid for w in problem.workloads))
    yield runtime, job
    runtime.db.dispose()


def solution() -> Solution:
    return Solution.model_validate({
        "name": "diag_scale_cuda", "definition": "diag_scale", "author": "writer",
        "spec": {"languages": ["cuda"], "target_hardware": ["H100", "H200"], "entry_point": "launch.py::run"},
        "sources": [{"path": "launch.py", "content": LAUNCH}, {"path": "scale.cu", "content": KERNEL}]})


def tool(runtime: Runtime, job: Job, kind: str, **target) -> tuple[str, AttemptRow]:
    """One tool call of the scripted writer, its attempt answered by the evaluator's own logic."""
    sent: list[str] = []

    def send(attempt_id: str, device: str) -> None:
        sent.append(attempt_id)
        evaluate_attempt(runtime, attempt_id, device, "gpu-evaluator")

    def wait(attempt_id: str) -> str:
        with runtime.db.session() as db:
            return db.get(AttemptRow, attempt_id).status

    text = diagnose(runtime, job, "scripted", solution(), kind, tokens=50, send_evaluate=send, wait=wait, **target)
    print(f"\n--- {kind} ---\n{text}")
    with runtime.db.session() as db:
        return text, db.get(AttemptRow, sent[0])


def test_inspect_gives_ptxas_figures_and_the_kernels_sass(session):
    runtime, job = session
    text, attempt = tool(runtime, job, "inspect", kernel="scale")
    assert text.startswith("status: INSPECTED"), text
    assert re.search(r"kernel scale: registers \d+, spill stores B 0", text), text
    sass = text.split("SASS of scale:\n", 1)[1]
    assert "LDG" in sass and "FMUL" in sass and "STG" in sass and "EXIT" in sass, sass
    assert attempt.kind == "inspect" and attempt.gpu_seconds is not None and attempt.traces_hash is None


@pytest.mark.skipif(find_ncu() is None, reason="Nsight Compute (ncu) is not installed")
def test_profile_figures_agree_with_the_evaluators_timing(session):
    runtime, job = session
    text, attempt = tool(runtime, job, "profile", workload_uuid=f"w{BIG}")
    if text.startswith("status: UNSUPPORTED") and "cannot profile on this evaluator" in text:
        pytest.skip(f"this machine's ncu reads no counters (gVisor does not; Firecracker does): {text}")
    assert text.startswith("status: PROFILED"), text
    for figure in ("DRAM", "L2", "SM", "occupancy: achieved", "limited by", "registers/thread", "top warp stalls"):
        assert figure in text, f"{figure} missing from:\n{text}"
    assert "launch 0: scale grid" in text and "duration missing" not in text
    kernel_ms = float(re.search(r"one call: 1 launch, ([0-9.e+-]+) ms of kernel time", text).group(1))
    dram_pct = float(re.search(r"DRAM ([0-9.]+)%", text).group(1))
    assert dram_pct > 40, text  # a streaming multiply at this size runs near HBM speed
    assert attempt.kind == "profile" and attempt.gpu_seconds > 0 and json.loads(attempt.workload_uuids) == [f"w{BIG}"]
    with runtime.db.session() as db:
        assert db.scalars(select(TraceRow).where(TraceRow.attempt_id == attempt.id)).all() == []  # no verdict

    # The evaluator's own timing of the same solution on the same workload, as an evaluation.
    with runtime.db.session() as db:
        digest = put_solution(db, runtime.store, job.problem_id, solution())
        evaluation_id = create_attempt(db, job.problem_id, digest, "cuda", workload_uuids=[f"w{BIG}"]).id
    assert evaluate_attempt(runtime, evaluation_id, "cuda", "gpu-evaluator") == "PARTIAL"
    with runtime.db.session() as db:
        timed_ms = db.scalars(select(TraceRow).where(TraceRow.attempt_id == evaluation_id)).one().latency_ms
    in_profile = float(re.search(r"median ([0-9.e+-]+) ms", text).group(1))  # the profile attempt's own run
    print(f"\nncu kernel time {kernel_ms:.4f} ms; evaluator median {timed_ms:.4f} ms (profile attempt's run "
          f"{in_profile:.4f} ms); ratio {timed_ms / kernel_ms:.3f}")
    assert 0.5 < timed_ms / kernel_ms < 2.0, (kernel_ms, timed_ms)
    assert 0.5 < in_profile / kernel_ms < 2.0, (kernel_ms, in_profile)

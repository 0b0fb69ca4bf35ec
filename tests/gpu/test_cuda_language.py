"""Language `cuda` on a real GPU: a correct inline-PTX kernel passes; each bad kernel gets its status,
and the attempt after it passes (the evaluator replaces its child; nothing else is lost).

Run on the GPU machine: `pytest -m gpu tests/gpu`.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from services.evaluator.config import EvalConfig  # noqa: E402

from services.evaluator.evaluate import evaluate  # noqa: E402
from shared.schema import Solution, Status, load_problem  # noqa: E402
from shared.store import LocalStore  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

REFERENCE = "import torch\n\n@torch.no_grad()\ndef run(x, w):\n    return x * w\n"

GOOD = r"""
extern "C" __global__ void scale(const float* __restrict__ x, const float* __restrict__ w,
                                 float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float r;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(x[i]), "f"(w[i]));
    y[i] = r;
}
"""

LAUNCH = """
def run(x, w, y, *, kernels):
    n = y.numel()
    kernels.scale(x, w, y, n, grid=((n + BLOCK - 1) // BLOCK,), block=(BLOCK,))
"""

BAD = {
    "compile_error": (GOOD.replace("y[i] = r;", "y[i] = r + not_declared;"), Status.COMPILE_ERROR),
    "wrong_values": (GOOD.replace("y[i] = r;", "y[i] = r + 1.0f;"), Status.INCORRECT_NUMERICAL),
    "unwritten_element": (GOOD.replace("if (i >= n) return;", "if (i >= n - 1) return;"),
                          Status.INCORRECT_NUMERICAL),
    "out_of_bounds_write": (GOOD.replace("y[i] = r;", "y[i] = r; y[i + (1ll << 33)] = r;"), Status.RUNTIME_ERROR),
    "infinite_loop": (GOOD.replace("y[i] = r;", "volatile float* v = y; while (true) { v[i] = r; }"),
                      Status.TIMEOUT),
    "illegal_address": (GOOD.replace("y[i] = r;", "((float*)0x10)[i] = r;"), Status.RUNTIME_ERROR),
}


@pytest.fixture(scope="module")
def problem(readable_tmp):
    root = Path(tempfile.mkdtemp(prefix="scale-", dir=readable_tmp))
    root.chmod(0o755)
    definition = {
        "name": "scale", "op_type": "elementwise", "axes": {"n": {"type": "var"}},
        "inputs": {"x": {"shape": ["n"], "dtype": "float32"}, "w": {"shape": ["n"], "dtype": "float32"}},
        "outputs": {"y": {"shape": ["n"], "dtype": "float32"}}, "reference": REFERENCE,
    }
    (root / "definition.json").write_text(json.dumps(definition))
    sizes = [1000, 1 << 20]
    (root / "workload.jsonl").write_text("".join(json.dumps(
        {"uuid": f"w{n}", "axes": {"n": n}, "inputs": {"x": {"type": "random"}, "w": {"type": "random"}},
         "tolerance": {"max_atol": 1e-6, "max_rtol": 1e-6, "required_matched_ratio": 1.0}}) + "\n" for n in sizes))
    return load_problem(root)


def cuda_solution(cu: str, name: str = "scale_ptx", launch: str = LAUNCH) -> Solution:
    return Solution.model_validate({
        "name": name, "definition": "scale", "author": "test",
        "spec": {"languages": ["cuda"], "target_hardware": ["H200"], "entry_point": "launch.py::run",
                 "tunables": {"BLOCK": [256, 128]}},
        "sources": [{"path": "launch.py", "content": launch}, {"path": "scale.cu", "content": cu}]})


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    return EvalConfig(device="cuda", correctness_rounds=3, timing_sets=2, warmup_runs=3, timing_runs=50,
                      timing_budget_s=0.5, attempt_timeout_s=60,
                      build_cache=LocalStore(tmp_path_factory.mktemp("store")))


def test_inline_ptx_kernel_passes(problem, config):
    result = evaluate(problem, cuda_solution(GOOD), config)
    assert result.status is Status.PASSED, result.message
    for trace in result.traces:
        assert trace.evaluation.performance.latency_ms > 0
        assert "H200" in trace.evaluation.environment.hardware or trace.evaluation.environment.hardware


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_kernel_gets_its_status_and_the_next_attempt_passes(problem, config, case):
    cu, expected = BAD[case]
    timeout = 15 if case == "infinite_loop" else config.attempt_timeout_s
    bad = evaluate(problem, cuda_solution(cu, f"bad_{case}"), dataclasses.replace(config, attempt_timeout_s=timeout))
    assert bad.status is expected, f"{case}: got {bad.status.value}: {bad.message[:2000]}"
    good = evaluate(problem, cuda_solution(GOOD), config)
    assert good.status is Status.PASSED, good.message


# A `cuda` solution in name only: its kernel builds, but PyTorch does the work (issue 10's fallback).
TORCH_FALLBACK = """
import torch


def run(x, w, y, *, kernels):
    torch.mul(x, w, out=y)
"""
# Its own kernel, after torch zeroed the output: a fill is set-up, not the work, and stays allowed.
ZEROED_FIRST = "def run(x, w, y, *, kernels):\n    y.zero_()\n" + LAUNCH.split("\n", 2)[2]


def test_a_torch_fallback_in_a_cuda_solution_is_a_reward_hack_and_a_fill_is_not(problem, config):
    fallback = evaluate(problem, cuda_solution(GOOD, "torch_fallback", TORCH_FALLBACK), config)
    assert fallback.status is Status.REWARD_HACK, fallback.message
    assert "does not define" in fallback.message, fallback.message
    zeroed = evaluate(problem, cuda_solution(GOOD, "zeroed_first", ZEROED_FIRST), config)
    assert zeroed.status is Status.PASSED, zeroed.message

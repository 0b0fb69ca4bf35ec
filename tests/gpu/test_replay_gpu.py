"""Record and replay for language `cuda` on a real GPU (services/evaluator/timer/): library seeds
are timed by a child that imports none of their Python (`timing.mode == "replay"`), and a launch.py
that does tensor work on the host is timed in its own process, flagged so on its traces.

Run on the GPU machine: `pytest -m gpu tests/gpu/test_replay_gpu.py`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from services.evaluator.config import EvalConfig  # noqa: E402
from services.evaluator.evaluate import evaluate  # noqa: E402
from services.evaluator.spares import Spares  # noqa: E402
from shared.schema import Status, load_problem  # noqa: E402
from test_cuda_language import GOOD, config, cuda_solution, problem  # noqa: E402,F401 - shared fixtures

PROBLEMS = Path(__file__).resolve().parents[2] / "problems"


@pytest.fixture(scope="module")
def pooled():
    """As the evaluator service runs: children (the timer among them) started ahead."""
    spares = Spares("cuda", None)
    yield EvalConfig(device="cuda", correctness_rounds=3, timing_sets=2, warmup_runs=2, timing_runs=50,
                     timing_budget_s=0.3, attempt_timeout_s=300, spares=spares)
    spares.close()


# Scratch allocated per call and two kernels (rmsnorm backward), a second kernel only for some
# shapes (cross entropy), a scratch buffer read by the second kernel (group norm).
@pytest.mark.parametrize("name", ["llama31_8b_rmsnorm_backward", "llama31_8b_cross_entropy",
                                  "sdxl_unet_groupnorm_silu"])
def test_a_library_seed_passes_replayed(pooled, name):
    problem = load_problem(PROBLEMS / name)
    seed = next(s for s in problem.seeds if s.spec.language.value == "cuda")
    result = evaluate(problem, seed, pooled, max_workloads=4)
    assert result.status is Status.PASSED, result.message[:3000]
    for trace in result.traces:
        timing = trace.evaluation.timing
        assert (timing.mode, timing.in_process_reason, timing.clock) == ("replay", None, "cupti"), timing
    assert "record" in result.child_phases, result.child_phases


# Host code that reads a value back from the GPU (a copy, no kernel): not replayable; timed in
# process, where it passes (its timed runs ran the cubin's kernel and a copy).
READS_A_VALUE = """
def run(x, w, y, *, kernels):
    assert x[0].item() == x[0].item()
    n = y.numel()
    kernels.scale(x, w, y, n, grid=((n + BLOCK - 1) // BLOCK,), block=(BLOCK,))
"""
# Host code that computes on tensors (a check of the values on the GPU): not replayable; timed in
# process, where torch's kernels among its timed runs are the fallback check's REWARD_HACK.
CHECKS_VALUES = READS_A_VALUE.replace("x[0].item() == x[0].item()", "bool(x.isfinite().all())")


def test_a_value_read_back_is_timed_in_process_and_flagged(problem, config):
    result = evaluate(problem, cuda_solution(GOOD, "reads_a_value", READS_A_VALUE), config)
    assert result.status is Status.PASSED, result.message
    for trace in result.traces:
        timing = trace.evaluation.timing
        assert timing.mode == "in_process", timing
        assert "aten._local_scalar_dense" in timing.in_process_reason, timing.in_process_reason
        assert trace.evaluation.log.startswith("not replayed, timed in the solution's own process")


def test_tensor_work_on_the_host_is_timed_in_process_and_its_kernels_are_foreign(problem, config):
    result = evaluate(problem, cuda_solution(GOOD, "checks_values", CHECKS_VALUES), config)
    assert result.status is Status.REWARD_HACK, result.message
    assert result.message.startswith("not replayed, timed in the solution's own process: workload w1000: the host "
                                     "code ran torch's `aten.abs.default`"), result.message
    assert "its cubin does not define" in result.message, result.message

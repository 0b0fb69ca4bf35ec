"""Output sets handed to the checker in GPU memory (`services/evaluator/harness/gpu_handover.py`): on the
GPU with the outer clock on, the candidate saves no output file (its phases say `export`, not
`save`), right outputs pass and wrong ones fail as through files; with the hand-over off, files.

Run on the GPU machine: `pytest -m gpu tests/gpu/test_gpu_handover_gpu.py`.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from services.evaluator.evaluate import evaluate  # noqa: E402
from shared.schema import Status  # noqa: E402
from test_cuda_language import GOOD, config, cuda_solution, problem  # noqa: E402,F401 - shared fixtures


def test_output_sets_reach_the_checker_in_gpu_memory(problem, config):
    pytest.importorskip("cuda.bindings")
    shared = evaluate(problem, cuda_solution(GOOD), config)
    assert shared.status is Status.PASSED, shared.message
    phases = shared.child_phases["candidate"]
    assert "export" in phases and "save" not in phases, phases
    files = evaluate(problem, cuda_solution(GOOD), dataclasses.replace(config, gpu_handover=False))
    assert files.status is Status.PASSED, files.message
    phases = files.child_phases["candidate"]
    assert "save" in phases and "export" not in phases, phases


def test_wrong_outputs_shared_in_gpu_memory_fail(problem, config):
    pytest.importorskip("cuda.bindings")
    wrong = evaluate(problem, cuda_solution(GOOD.replace("mul.rn.f32", "add.rn.f32"), "scale_wrong"), config)
    assert wrong.status is Status.INCORRECT_NUMERICAL and "correctness round 0" in wrong.message, wrong.message
    assert "export" in wrong.child_phases["candidate"]

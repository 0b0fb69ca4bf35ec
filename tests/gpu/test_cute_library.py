"""The shipped `cute_dsl` seed solutions (an elementwise op, a row reduction, a tensor-core GEMM)
pass on the GPU, on every workload of their problem.

Needs nvidia-cutlass-dsl on the GPU machine (../shared/device-wheels/cute-dsl gives the recipe). Run
there: `pytest -m gpu tests/gpu/test_cute_library.py`.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from services.evaluator.languages import cutedsl  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
              pytest.mark.skipif(not cutedsl.available(), reason="nvidia-cutlass-dsl is not installed here")]

from services.evaluator.evaluate import evaluate  # noqa: E402
from shared.schema import Status, load_problem  # noqa: E402
from test_library import PROBLEMS, config  # noqa: E402,F401 - the library test's config and spares

CUTE_SEEDS = ["gemma3_geglu", "llama31_8b_rmsnorm", "llama31_8b_gemm_o_proj"]


@pytest.mark.parametrize("name", CUTE_SEEDS)
def test_cute_seed_passes_every_workload(config, name):
    problem = load_problem(PROBLEMS / name)
    seed = next(s for s in problem.seeds if s.spec.language.value == "cute_dsl")
    result = evaluate(problem, seed, config)
    failed = [(t.workload.axes, t.evaluation.status.value, t.evaluation.log[:500])
              for t in result.traces if t.evaluation.status.value != "PASSED"]
    assert result.status is Status.PASSED and len(result.traces) == len(problem.workloads), result.message
    assert not failed, f"{seed.name}: {failed}"

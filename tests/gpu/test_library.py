"""Every seed solution of every shipped problem passes on the GPU, on every workload.

Run on the GPU machine: `pytest -m gpu tests/gpu/test_library.py` (47 attempts, about 8 minutes on
the H200 on 2026-12-03 with the checker: longer than one `device` call allows, so run it in parts by
node id).
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from services.evaluator.languages import cutedsl  # noqa: E402
from services.evaluator.config import EvalConfig  # noqa: E402
from services.evaluator.evaluate import evaluate  # noqa: E402
from services.evaluator.spares import Spares  # noqa: E402
from shared.schema import load_problem  # noqa: E402
from shared.schema.problem import find_problems  # noqa: E402

PROBLEMS = Path(__file__).resolve().parents[2] / "problems"
SEEDS = [(folder.name, i) for folder in find_problems([PROBLEMS])
         for i in range(len(load_problem(folder).seeds))]


@pytest.fixture(scope="module")
def config():
    spares = Spares("cuda", None)
    yield EvalConfig(device="cuda", correctness_rounds=3, timing_sets=2, warmup_runs=2, timing_runs=50,
                     timing_budget_s=0.3, attempt_timeout_s=600, spares=spares)
    spares.close()


@pytest.mark.parametrize(("name", "index"), SEEDS, ids=[f"{n}-{i}" for n, i in SEEDS])
def test_seed_passes_every_workload(config, name, index):
    problem = load_problem(PROBLEMS / name)
    seed = problem.seeds[index]
    if seed.spec.language.value == "cute_dsl" and not cutedsl.available():
        pytest.skip("nvidia-cutlass-dsl is not installed here (tests/gpu/test_cute_library.py needs it too)")
    result = evaluate(problem, seed, config)
    failed = [(t.workload.axes, t.evaluation.status.value, t.evaluation.log[:500])
              for t in result.traces if t.evaluation.status.value != "PASSED"]
    assert not failed, f"{seed.name} ({seed.spec.language.value}): {failed}"

"""The outer clock on a GPU (on by default since these passed on the H200, 2026-12-03).
Honest solutions, fast and slow, `cuda` and `pytorch`, must PASS with it on: a false positive
would call good kernels hacks. A solution that forges its results at import must not PASS.

Run on the GPU machine: `pytest -m gpu tests/gpu/test_outer_clock_gpu.py`; the trace messages
and `result.message` give the windows when a case fails.
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
from test_gpu_hacks import pytorch_solution  # noqa: E402

TORCH_MUL = "import torch\n\ndef run(x, w, y):\n    torch.mul(x, w, out=y)\n"

# Honest but slow: 2e6 SM cycles (about 1 ms) of spinning before the product, on the current stream.
SLOW = "import torch\n\ndef run(x, w, y):\n    torch.cuda._sleep(2_000_000)\n    torch.mul(x, w, out=y)\n"

# Writes a result file with a made-up latency and the correctness rounds' outputs (from the seeds
# in its job), then exits before the harness runs: no window on the evaluator's channel.
FORGE_AT_IMPORT = """
import json
import os
from pathlib import Path

import torch

from services.evaluator.harness import tensorfile
from services.evaluator.harness.inputs import make_inputs
from shared.schema import Definition, Workload

JOB = json.loads(Path("job.json").read_text())
results = []
for index, workload, timed, seeds in zip(JOB["indices"], JOB["workloads"], JOB["timed_sets"], JOB["set_seeds"]):
    for s in range(JOB["correctness_rounds"] + timed):
        if seeds is not None and s < len(seeds):
            x = make_inputs(Definition.model_validate(JOB["definition"]), Workload.model_validate(workload),
                            seeds[s], torch.device("cuda"), None, None)
            y = x["x"] * x["w"]
        else:
            y = torch.zeros(workload["axes"]["n"], device="cuda")
        tensorfile.save({"y": y}, Path(JOB["outputs_dir"]) / f"w{index}_s{s}.st")
    results.append({"uuid": workload["uuid"], "status": "OK",
                    "latency": {"median_ms": 1e-3, "min_ms": 1e-3, "max_ms": 1e-3, "runs": timed, "clock": "cupti"}})
Path(JOB["result_path"]).write_text(json.dumps({"workloads": results}))
os._exit(0)


def run(x, w, y):
    y.zero_()
"""


@pytest.fixture(scope="module")
def clocked(config):
    return dataclasses.replace(config, outer_clock=True)


@pytest.mark.parametrize("case", ["cuda_ptx", "torch_mul", "slow_spin"])
def test_honest_solutions_pass_with_the_outer_clock_on(problem, clocked, case):
    solution = {"cuda_ptx": lambda: cuda_solution(GOOD), "torch_mul": lambda: pytorch_solution("mul", TORCH_MUL),
                "slow_spin": lambda: pytorch_solution("slow", SLOW)}[case]()
    for _ in range(2):  # twice: the second attempt finds every cache warm, the window at its shortest
        result = evaluate(problem, solution, clocked)
        assert result.status is Status.PASSED, result.message


def test_results_forged_at_import_do_not_pass_with_the_outer_clock_on(problem, clocked):
    result = evaluate(problem, pytorch_solution("forge", FORGE_AT_IMPORT), clocked)
    assert result.status in (Status.REWARD_HACK, Status.INCORRECT_NUMERICAL), result.message

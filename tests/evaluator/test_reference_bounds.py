"""A problem's reference is bounded and judged like the problem's, not the solution's (issue 25):
outputs that differ from the definition (shape, dtype) make the workload INVALID_REFERENCE instead
of INCORRECT_SHAPE for every solution; a reference that stops making progress is stopped after
`workload_timeout_s`, and one that runs on after its own `reference_timeout_s` (a setting), not the
900 s that used to be fixed in code."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from evalkit import FAST, affine_definition, affine_workloads, make_problem, make_solution
from services.evaluator.config import EvalConfig
from services.evaluator.evaluate import evaluate
from shared.celery_app import make_celery
from shared.schema import Status
from shared.settings import Settings

HONEST = """
def run(x, w, b, y):
    y.copy_(x * w + b)
"""


def reference_problem(tmp_path: Path, body: str, name: str):
    reference = "import time\nimport torch\n\ndef run(x, w, b):\n" + "".join(f"    {line}\n" for line in body.splitlines())
    return make_problem(tmp_path, affine_definition("float32", name=name, reference=reference), affine_workloads())


@pytest.mark.parametrize("body, says", [
    ("return (x * w + b)[:, :8]", "has shape (3, 8), the definition says (3, 16)"),
    ("return (x * w + b).double()", "has dtype float64, the definition says float32"),
    ("return (x * w + b).sum().item()", "is a float, the definition has a float32 tensor (3, 16)"),
], ids=["shape", "dtype", "scalar"])
def test_outputs_off_the_definition_are_the_references_fault(tmp_path: Path, body: str, says: str) -> None:
    problem = reference_problem(tmp_path, body, "off_definition")
    result = evaluate(problem, make_solution(HONEST, "off_definition"), FAST)
    assert result.status is Status.INVALID_REFERENCE, result.message
    assert says in result.message and "do not match the definition" in result.message
    assert {t.evaluation.status for t in result.traces} == {Status.INVALID_REFERENCE}


@pytest.mark.parametrize("workload_timeout_s, reference_timeout_s, says", [
    (2.0, 600.0, "spent more than 2 s on one workload"),  # no progress: the stall limit, as a candidate's
    (600.0, 3.0, "ran past 3 s"),  # its own limit, a setting
], ids=["stalled", "over_its_own_limit"])
def test_a_sleeping_reference_is_stopped(tmp_path: Path, workload_timeout_s: float, reference_timeout_s: float,
                                         says: str) -> None:
    problem = reference_problem(tmp_path, "time.sleep(600)\nreturn x * w + b", "sleeping_reference")
    config = dataclasses.replace(FAST, workload_timeout_s=workload_timeout_s, reference_timeout_s=reference_timeout_s)
    started = time.monotonic()
    result = evaluate(problem, make_solution(HONEST, "sleeping_reference"), config)
    assert result.status is Status.INVALID_REFERENCE, result.message
    assert says in result.message
    assert time.monotonic() - started < 120  # stopped by the short limit, not by the 600 s one


def test_the_reference_timeout_is_a_setting_and_the_task_limit_covers_it() -> None:
    settings = Settings.from_env({"KERNELSWARM_REFERENCE_TIMEOUT_S": "450", "KERNELSWARM_REDIS_URL": "redis://x"})
    assert EvalConfig.from_settings(settings).reference_timeout_s == 450.0
    limit = make_celery(settings).conf.task_time_limit
    assert limit >= settings.attempt_timeout_s + 450.0
    default = Settings.from_env({"KERNELSWARM_REDIS_URL": "redis://x"})
    assert EvalConfig.from_settings(default).reference_timeout_s < default.attempt_timeout_s

"""A diagnostic attempt answered (`AttemptRow.kind` "inspect" or "profile"): its text and status,
which `record` writes on the row in place of a verdict. PROFILED and INSPECTED are statuses of
their own, never PASSED or PARTIAL: nothing that ranks, counts verdicts or tunes reads them
(`shared.repository.VERDICT_KIND`)."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass

from services.evaluator.config import EvalConfig
from services.evaluator.evaluate import scratch_root
from services.evaluator.scratch import make_folder
from services.evaluator.tools.inspect_build import inspect_solution
from services.evaluator.tools.profile import profile_workload
from shared.hardware import HardwareSpec
from shared.repository import INSPECT, INSPECTED, PROFILE, PROFILED
from shared.schema import Problem, Solution, Status

MESSAGE_CHARS = 6000  # the row's message: the tools' own budgets (SASS 3000, resources 1500) fit in it
DEFAULT_ARCH = "sm_90a"  # inspect on an evaluator without a GPU: the target the GPU evaluators build for


@dataclass(frozen=True)
class Answer:
    status: str
    message: str
    seconds: float  # wall time spent on it (on a GPU evaluator, the GPU's: it was held for it)


def answer(kind: str, tool_args: str | None, problem: Problem, solution: Solution, config: EvalConfig,
           arch: str | None, hardware: HardwareSpec | None = None, hardware_name: str = "") -> Answer:
    started = time.monotonic()
    args = _args(tool_args)
    if kind == INSPECT:
        folder = make_folder("insp", scratch_root(config))
        try:
            found = inspect_solution(solution, arch or DEFAULT_ARCH, folder / "build", args.get("kernel"))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        status, text = (found.status.value if found.status else INSPECTED), found.text
    elif kind == PROFILE:
        done = profile_workload(problem, solution, config, hardware.bandwidth_gbps() if hardware else None,
                                hardware_name)
        status, text = (done.status.value if done.status else PROFILED), done.text
    else:
        status, text = Status.UNSUPPORTED.value, f"no diagnostic tool `{kind}` (inspect, profile)"
    return Answer(status, text[:MESSAGE_CHARS], time.monotonic() - started)


def _args(tool_args: str | None) -> dict:
    """The tool's arguments (`AttemptRow.tool_args`, JSON written by the worker): a dict, else none."""
    try:
        args = json.loads(tool_args) if tool_args else {}
    except ValueError:
        return {}
    return args if isinstance(args, dict) else {}

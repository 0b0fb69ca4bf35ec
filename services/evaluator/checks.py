"""The parent's verdict on what the children reported: every output set the candidate left checked
against the reference's, the count of timed runs held against the sets made for them, and what a
failing reference means on this device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from services.evaluator import tensorfile
from services.evaluator.correctness import Check, compare
from shared.schema import Problem, Status, Workload


def timed_runs(result: dict[str, Any], timed_sets: int) -> int:
    """The timed runs the candidate reports (each on its own input set, each to be checked); a
    count that its sets cannot account for is -1, which fails the check."""
    runs = result.get("latency", {}).get("runs")
    return runs if isinstance(runs, int) and 1 <= runs <= timed_sets else -1


def check_sets(problem: Problem, workload: Workload, index: int, rounds: int, outputs_dir: Path,
               expected_sets: dict[str, dict[str, Any]], device: torch.device, runs: int) -> Check:
    """Every correctness round and the outputs of every timed run (`runs`, from `timed_runs`: each
    had its own input set), every output tensor."""
    if runs < 0:
        return Check(Status.REWARD_HACK, "the solution's timing reported a count of timed runs that its "
                                         "timed input sets cannot account for (a forged result)")
    tolerance = workload.effective_tolerance
    worst_abs = worst_rel = 0.0
    ratio = 1.0
    for s in range(rounds + runs):
        expected = expected_sets[f"w{index}_s{s}"]
        path = outputs_dir / f"w{index}_s{s}.st"
        phase = "correctness round" if s < rounds else "timed run on input set"
        if not path.exists():
            return Check(Status.RUNTIME_ERROR, f"the solution left no outputs for {phase} {s}")
        try:
            actual = tensorfile.load(path, device)
        except Exception as error:  # the file is the candidate's: unreadable means it was tampered with
            return Check(Status.RUNTIME_ERROR, f"the outputs of input set {s} are unreadable: {error}")
        for name in problem.definition.outputs:
            want = expected[name].to(device) if isinstance(expected[name], torch.Tensor) else expected[name]
            check = compare(name, actual.get(name), want, tolerance)
            if check.status is not Status.PASSED:
                return Check(check.status, f"{phase} {s}: {check.message}", check.max_absolute_error,
                             check.max_relative_error, check.matched_ratio)
            worst_abs = max(worst_abs, check.max_absolute_error)
            worst_rel = max(worst_rel, check.max_relative_error)
            ratio = min(ratio, check.matched_ratio)
    return Check(Status.PASSED, "", worst_abs, worst_rel, ratio)


FP4_DTYPES = {"float4_e2m1", "float4_e2m1fn_x2"}


def reference_failed(problem: Problem, device: torch.device, message: str) -> tuple[Status, str]:
    """A reference that fails is INVALID_REFERENCE: the problem cannot be judged here, whatever the
    solution (the planner retires a problem that no attempt passed after a few of these). Where the
    problem is NVFP4 and this device cannot run FP4 (before sm_100, or a CPU), the message says so
    first: the hardware, not the problem's author, is the likelier cause."""
    tensors = [*problem.definition.inputs.values(), *problem.definition.outputs.values()]
    if any(t.dtype.value in FP4_DTYPES for t in tensors):
        capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
        if capability is None or capability < (10, 0):
            where = f"sm_{capability[0]}{capability[1]}" if capability else "the CPU"
            return Status.INVALID_REFERENCE, (f"the problem uses NVFP4 (FP4 tensors), which needs an sm_100 or newer "
                                              f"GPU; this evaluator runs on {where}, where its reference "
                                              f"failed:\n{message}")
    return Status.INVALID_REFERENCE, message

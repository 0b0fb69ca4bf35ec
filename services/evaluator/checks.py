"""The parent's verdict on what the children reported: every output set the candidate left checked
against the reference's, the count of timed runs held against the sets made for them, and what a
failing reference means on this device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from services.evaluator import tensorfile
from services.evaluator.correctness import Check, compare
from services.evaluator.outer_clock import Oversized
from shared.schema import Problem, Status, Tolerance, Workload


def timed_runs(result: dict[str, Any], timed_sets: int) -> int:
    """The timed runs the candidate reports (each on its own input set, each to be checked); a
    count that its sets cannot account for is -1, which fails the check."""
    runs = result.get("latency", {}).get("runs")
    return runs if isinstance(runs, int) and 1 <= runs <= timed_sets else -1


def check_sets(problem: Problem, workload: Workload, index: int, rounds: int, outputs_dir: Path,
               expected_sets: dict[str, dict[str, Any]], device: torch.device, runs: int,
               sealed: dict[str, bytearray | Oversized | None] | None = None) -> Check:
    """Every correctness round and the outputs of every timed run (`runs`, from `timed_runs`: each
    had its own input set), every output tensor. `sealed`, where the outer clock is on: the timed
    runs' outputs as they were when the candidate's window closed (`outer_clock.Sealer`)."""
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
        copy = sealed.get(f"w{index}_s{s}") if sealed is not None and s >= rounds else None
        if sealed is not None and s >= rounds and copy is None:
            if path.exists():
                return Check(Status.REWARD_HACK, f"the outputs of {phase} {s} were not there (or not a file of "
                                                 f"their size) when the evaluator's window on the timed runs "
                                                 f"closed: made after the window, out of its clock's sight")
            return Check(Status.RUNTIME_ERROR, f"the solution left no outputs for {phase} {s}")
        if copy is None and not path.exists():
            return Check(Status.RUNTIME_ERROR, f"the solution left no outputs for {phase} {s}")
        if isinstance(copy, Oversized):
            return _oversized(problem, phase, s, copy, expected)
        try:
            actual = tensorfile.loads(copy, device) if copy is not None else tensorfile.load(path, device)
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


def _oversized(problem: Problem, phase: str, s: int, copy: Oversized, expected: dict[str, Any]) -> Check:
    """A timed output file larger than its outputs can be: the output it got the shape or dtype
    of wrong, from its header; if none, it carried bytes beyond its outputs, which the harness
    never writes."""
    try:
        actual = tensorfile.loads(copy.header, header_only=True)
    except Exception as error:  # noqa: BLE001 - the candidate's file: unreadable, whatever the reason
        return Check(Status.RUNTIME_ERROR, f"the outputs of input set {s} are unreadable: {error}")
    for name in problem.definition.outputs:
        want, got = expected[name], actual.get(name)
        if isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor) and (
                tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype):
            check = compare(name, got, want, Tolerance())
            return Check(check.status, f"{phase} {s}: {check.message}")
    return Check(Status.REWARD_HACK, f"the outputs file of {phase} {s} is larger than its outputs: bytes beyond "
                                     f"them, which the harness never writes")


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

"""The evaluator's side of record and replay (language `cuda`): what the record child reported,
judged workload by workload, and the job of the child that times the solution.

Each workload's two recordings (correctness rounds 0 and 1) are untrusted input: a result that is
not a recording is a forged result (REWARD_HACK); a plan outside CUDA's limits, naming a kernel the
cubin lacks or pointing outside its buffers cannot run (RUNTIME_ERROR, as its launch would fail in
its own process). A plan the recorder refused (tensor work on the host) or two plans that differ
(host logic that depends on the input values) is no failure: the attempt is then timed in process
as every other language is, and its traces say so and why (`Routed.reason`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from services.evaluator.harness.inputs import torch_dtype
from services.evaluator.protocol import CandidateJob
from services.evaluator.timer.plan import Plan, PlanInvalid, differences, parse, validate
from shared.schema import Definition, Status, Workload

REPLAY = "replay"
IN_PROCESS = "in_process"


@dataclass(frozen=True)
class Routed:
    """`failed`: workload index -> (status, message) for those that end here. `plans`: workload UUID
    -> plan for the others, where every one of them replays; else `reason` says why the attempt is
    timed in process (one reason for the attempt: its workloads share one timing child)."""
    failed: dict[int, tuple[Status, str]] = field(default_factory=dict)
    plans: dict[str, Plan] | None = None
    reason: str | None = None

    @property
    def mode(self) -> str:
        return REPLAY if self.plans is not None else IN_PROCESS


def route(definition: Definition, workloads: dict[int, Workload], results: dict[int, dict[str, Any]],
          kernels: frozenset[str], destination_passing: bool = True) -> Routed:
    """Judge each workload's record `results[index]` (from `ChildResults.results`) against the cubin's
    `kernels`; `workloads`: index -> workload, for the buffers' sizes; `destination_passing`: the
    solution's style (off: each plan must say which tensor is each output)."""
    failed: dict[int, tuple[Status, str]] = {}
    plans: dict[str, Plan] = {}
    reasons: list[str] = []
    for index, result in results.items():
        workload = workloads[index]
        if result.get("status") != "OK":
            failed[index] = _failure(result)
            continue
        try:
            first, second = _recordings(result)
        except PlanInvalid as forged:
            failed[index] = (Status.REWARD_HACK, f"the record step's result is not a recording of the call "
                                                 f"(a forged result file): {forged}")
            continue
        sizes, scalars = buffer_sizes(definition, workload)
        try:
            for plan in (first, second):
                if plan.refused is None:
                    validate(plan, kernels, sizes, scalars)
                    _check_returned(plan, definition, destination_passing)
        except PlanInvalid as invalid:
            failed[index] = (Status.RUNTIME_ERROR, f"the solution's launches cannot run: {invalid}")
            continue
        if first.refused or second.refused:
            reasons.append(f"workload {workload.uuid}: {first.refused or second.refused}")
            continue
        differ = differences(first, second)
        if differ:
            reasons.append(f"workload {workload.uuid}: its launches depend on the input values (two input "
                           f"sets, two plans: {'; '.join(differ)})")
            continue
        plans[workload.uuid] = first
    if reasons:
        shown = reasons[:2] + ([f"and {len(reasons) - 2} more workloads"] if len(reasons) > 2 else [])
        return Routed(failed, None, "not replayed, timed in the solution's own process: " + "; ".join(shown))
    return Routed(failed, plans, None)


def _check_returned(plan: Plan, definition: Definition, destination_passing: bool) -> None:
    expected = None if destination_passing else len(definition.outputs)
    found = None if plan.returned is None else len(plan.returned)
    if found != expected:
        raise PlanInvalid(f"the call returned {found or 0} tensors where {expected or 0} outputs were expected")


def _failure(result: dict[str, Any]) -> tuple[Status, str]:
    """A record that failed, as the child reported it; a status that is none of the verdict's is a
    forged result file."""
    try:
        status = Status(result.get("status"))
    except ValueError:
        return Status.REWARD_HACK, "the record step reported a status that is none of the evaluator's (a forged result file)"
    if status is Status.PASSED:
        return Status.REWARD_HACK, "the record step reported a verdict of its own (a forged result file)"
    return status, str(result.get("message", ""))


def _recordings(result: dict[str, Any]) -> tuple[Plan, Plan]:
    recorded = result.get("plans")
    if not isinstance(recorded, list) or len(recorded) != 2:
        raise PlanInvalid("two plans were expected")
    return parse(recorded[0]), parse(recorded[1])


def buffer_sizes(definition: Definition, workload: Workload) -> tuple[dict[tuple[str, str], int], frozenset[str]]:
    """Each tensor input's and output's bytes in this workload, and the names of the scalar inputs."""
    axes = definition.resolve_axes(workload.axes)
    sizes: dict[tuple[str, str], int] = {}
    scalars = set()
    for kind, specs in (("input", definition.inputs), ("output", definition.outputs)):
        for name, spec in specs.items():
            shape = definition.shape_of(spec, axes)
            if shape is None:
                scalars.add(name)
                continue
            count = 1
            for n in shape:
                count *= n
            sizes[(kind, name)] = count * torch_dtype(spec.dtype).itemsize
    return sizes, frozenset(scalars)


def timer_job(job: CandidateJob, plans: dict[str, Plan]) -> CandidateJob:
    """The candidate job made a timer job: the plans in (its entry is then never imported)."""
    return job.model_copy(update={"replay": {uuid: plan.model_dump(mode="json") for uuid, plan in plans.items()}})

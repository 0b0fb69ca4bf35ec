"""The process Nsight Compute profiles for the `profile` tool (`python -m
services.evaluator.tools.target JOB`): a solution's recorded launch plan replayed on its cubin, as
the `cuda` timer replays it (`timer.replay`), on one fresh input set. No Python of the solution's
is imported: the plan is data the evaluator validated (`timer.route`), the kernels are the cubin's.

It calls the plan `WARMUP_CALLS` times outside the profiler's range (module load, first-launch
costs), then once inside it (`cudaProfilerStart`/`Stop`: ncu runs with `--profile-from-start off`),
and pops its CUDA context before it exits (pycuda aborts the process otherwise, which ncu reports
as the target's failure)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from shared.schema import Definition, Workload
from shared.schema.base import Frozen

WARMUP_CALLS = 2


class ProfileJob(Frozen):
    """What the target is given (its `job.json`): the cubin, the workload's validated plan, and
    what makes its inputs and outputs."""
    cubin_path: str
    plan: dict[str, Any]
    definition: Definition
    workload: Workload
    device: str
    destination_passing_style: bool
    seed: int
    problem_root: str | None = None


def run(job: ProfileJob) -> None:
    import torch

    from services.evaluator.harness.inputs import make_inputs, torch_dtype
    from services.evaluator.languages.launch import Kernels
    from services.evaluator.timer.plan import Plan
    from services.evaluator.timer.replay import ReplayEntry

    device = torch.device(job.device)  # "cuda" or "cuda:N", as the evaluator's
    definition, workload = job.definition, job.workload
    kernels = Kernels(Path(job.cubin_path).read_bytes(), device)
    try:
        torch.cuda.set_stream(torch.cuda.ExternalStream(kernels.stream().handle, device=device))
        inputs = make_inputs(definition, workload, job.seed, device,
                             Path(job.problem_root) if job.problem_root else None, None)
        axes = definition.resolve_axes(workload.axes)
        outputs = [torch.empty(definition.shape_of(spec, axes), dtype=torch_dtype(spec.dtype), device=device)
                   for spec in definition.outputs.values()] if job.destination_passing_style else []
        entry = ReplayEntry({workload.uuid: Plan.model_validate(job.plan)}, list(definition.inputs),
                            list(definition.outputs), kernels, device, job.destination_passing_style)
        entry.select(workload.uuid)
        args = [*inputs.values(), *outputs]
        for _ in range(WARMUP_CALLS):
            entry(*args)
        torch.cuda.synchronize(device)
        torch.cuda.profiler.start()
        entry(*args)
        torch.cuda.synchronize(device)
        torch.cuda.profiler.stop()
    finally:
        kernels.close()


def main(argv: list[str]) -> int:
    job = ProfileJob.model_validate_json(Path(argv[0]).read_text())
    run(job)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

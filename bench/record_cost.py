"""What the record step of a `cuda` attempt costs on the host, per call (harness/recorder.py): each
library `cuda` seed's launch.py recorded on CPU tensors of its problem's smallest workload (the
recording launches nothing, so the device does not matter but for the seeds that assert `is_cuda`,
which are left out on a CPU), then the evaluator's side: parse, validate, compare.

    python bench/record_cost.py --out record_cost.json [--device cuda]

Prints per seed the median of 50 recordings (µs) and of the evaluator's checks; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from services.evaluator.harness.entry import empty_outputs, load_module
from services.evaluator.harness.inputs import InputError, make_inputs
from services.evaluator.languages.build import resolved_tunables
from services.evaluator.timer.plan import differences, parse, validate
from services.evaluator.harness.recorder import RecordingKernels, record_call
from services.evaluator.timer.route import buffer_sizes
from shared.hardware import cpu_name
from shared.schema import load_problem
from shared.schema.problem import find_problems

PROBLEMS = Path(__file__).resolve().parents[1] / "problems"
CALLS = 50


def seed_cost(folder: Path, device: torch.device) -> dict | None:
    problem = load_problem(folder)
    seed = next((s for s in problem.seeds if s.spec.language.value == "cuda"), None)
    if seed is None:
        return None
    workload = min(problem.workloads, key=lambda w: sum(v for v in w.axes.values() if isinstance(v, int)))
    launch = next(s.content for s in seed.sources if s.path == seed.entry_file)
    module = load_module(f"seed_{folder.name}", launch, resolved_tunables(seed), seed.entry_file)
    function = getattr(module, seed.entry_symbol)
    axes = problem.definition.resolve_axes(workload.axes)
    try:
        inputs = make_inputs(problem.definition, workload, 1, device, problem.root, None)
    except InputError as custom:  # inputs made by the reference's own function: not loaded here
        return {"problem": folder.name, "skipped": str(custom)}
    outputs = empty_outputs(problem.definition, axes, device)
    kernels = RecordingKernels(frozenset(_kernel_names(launch)))
    try:
        record_call(function, inputs, outputs, kernels)
    except AssertionError as refused:  # a seed that asserts is_cuda, on a CPU
        return {"problem": folder.name, "skipped": f"assertion on {device}: {refused}"}
    recording, checking = [], []
    for _ in range(CALLS):
        started = time.perf_counter()
        plan = record_call(function, inputs, outputs, kernels)
        recording.append(time.perf_counter() - started)
        data = plan.model_dump(mode="json")
        started = time.perf_counter()
        first, second = parse(data), parse(data)
        sizes, scalars = buffer_sizes(problem.definition, workload)
        validate(first, kernels._names, sizes, scalars)
        validate(second, kernels._names, sizes, scalars)
        assert not differences(first, second)
        checking.append(time.perf_counter() - started)
    return {"problem": folder.name, "workload": workload.uuid, "steps": len(plan.steps), "refused": plan.refused,
            "record_us": round(statistics.median(recording) * 1e6, 1),
            "evaluator_checks_us": round(statistics.median(checking) * 1e6, 1)}


def _kernel_names(launch: str) -> set[str]:
    """The names launch.py calls on `kernels.` (the cubin is not built here)."""
    import re

    return set(re.findall(r"kernels\.([A-Za-z_][A-Za-z0-9_]*)\(", launch))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path("record_cost.json"))
    args = parser.parse_args()
    device = torch.device(args.device)
    rows = [r for r in (seed_cost(f, device) for f in find_problems([PROBLEMS])) if r is not None]
    for row in rows:
        print(row, flush=True)
    hardware = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU {cpu_name()}"
    args.out.write_text(json.dumps({"date": datetime.now(timezone.utc).isoformat(), "hardware": hardware,
                                    "command": f"python bench/record_cost.py --device {args.device}",
                                    "calls_per_seed": CALLS, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()

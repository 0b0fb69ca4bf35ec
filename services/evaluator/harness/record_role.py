"""The candidate child's record mode (`job["mode"] == "record"`, language `cuda`): the solution's
`launch.py` loaded with a recording `kernels` handle and called once on each of the workload's first
two correctness rounds' input sets, into outputs pre-filled as the harness does. Both plans go back
in the result; the evaluator validates and compares them (this process stays untrusted, and may be
killed once its result is written). Imported by `harness.main` only in that mode.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from services.evaluator.harness import tensorfile
from services.evaluator.harness.entry import empty_outputs, load_module
from services.evaluator.harness.inputs import make_inputs
from services.evaluator.harness.phases import phase, traceback_tail
from services.evaluator.protocol import CandidateJob
from services.evaluator.timer.plan import RECORDED_SETS, cubin_kernels
from services.evaluator.harness.recorder import RecordingKernels, record_call
from shared.schema import Definition, Workload


def run_record(job: CandidateJob, definition: Definition, workload: Workload, index: int, device: torch.device,
               state: dict) -> dict[str, Any]:
    try:
        if "entry" not in state:
            state["kernels"] = RecordingKernels(cubin_kernels(Path(job.artifact_path).read_bytes()))
            state["entry"] = _load_function(job)
        entry, kernels = state["entry"], state["kernels"]
        axes = definition.resolve_axes(workload.axes)
        dps = job.destination_passing_style
        # Every set and its outputs made before the first call: no address of one is reused by the other.
        sets = [_input_set(job, definition, workload, index, s, device) for s in range(RECORDED_SETS)]
        outputs = [empty_outputs(definition, axes, device) if dps else None for _ in sets]
        plans = []
        with phase("record"):
            for inputs, buffers in zip(sets, outputs):
                plan = record_call(entry, inputs, buffers, kernels, list(definition.outputs))
                plans.append(plan.model_dump(mode="json"))
    except Exception:
        return {"status": "RUNTIME_ERROR", "message": traceback_tail()}
    return {"status": "OK", "plans": plans}


def _input_set(job: CandidateJob, definition: Definition, workload: Workload, index: int, s: int,
               device: torch.device) -> dict[str, Any]:
    """Input set `s` as the harness makes it (`harness.candidate._input_set`), less the digest's comparison:
    a set made otherwise than the reference's changes no verdict here, only what is recorded."""
    seeds = job.set_seeds[job.indices.index(index)]
    if seeds is None:
        return tensorfile.load(Path(job.inputs_dir) / f"w{index}_s{s}.st", device)
    return make_inputs(definition, workload, seeds[s], device, None, None)


def _load_function(job: CandidateJob):
    """The solution's entry function, as `entry.load_entry` loads it (its module's globals start
    with the tunables), called with the recording handle in place of `launch.Kernels`."""
    source_dir = Path(job.solution_dir)
    path = source_dir / job.entry_file
    sys.path.insert(0, str(source_dir))
    module = load_module("solution_entry", path.read_text(), job.tunables, str(path))
    function = getattr(module, job.entry_symbol, None)
    if not callable(function):
        raise AttributeError(f"{job.entry_file} defines no callable `{job.entry_symbol}`")
    return function

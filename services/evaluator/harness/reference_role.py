"""The reference role of an attempt's child (trusted): every input set drawn from a seed of its own,
hashed from the attempt's secret; the reference run on each; the expected outputs saved where the
candidate cannot read them; the sets passed on to the candidate as seeds and digests or as files;
the reference timed eager (and under torch.compile, for T_b). Runs inside the harness's `main`, whose
phases, timing plan and traceback helpers (`phases.py`) it shares with the candidate; the
candidate's process does not import it (unless forked from the fork server, which preloads both).
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from services.evaluator.harness import tensorfile
from services.evaluator.harness.correctness import unmatchable
from services.evaluator.harness.guards import Guard, guard_floor_ms
from services.evaluator.harness.entry import as_outputs, empty_holding, hold, load_module, off_definition
from services.evaluator.harness.inputs import InputError, digest, make_inputs, regenerable
from services.evaluator.harness.phases import PHASES, phase, timing_plan, traceback_tail
from services.evaluator.harness.timing import Latency, TimingPlan, synchronize, time_runs
from services.evaluator.protocol import EVALUATOR_FAULT, ReferenceJob, is_fault
from shared.schema import Definition, Workload


def set_seed(secret: int, workload: int, input_set: int) -> int:
    """Each input set's generator seed, hashed from the attempt's secret: knowing (or recovering
    from its values) one set's seed tells nothing about another's. 62 bits: what every torch
    generator takes."""
    digest = hashlib.sha256(f"{secret}:{workload}:{input_set}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 2


def run_reference(job: ReferenceJob, definition: Definition, workload: Workload, index: int,
                  device: torch.device, state: dict) -> dict[str, Any]:
    if "module" not in state:
        # The guard the candidate's timed calls check (its verdicts mean nothing here): the reference's
        # timed calls make the same check, at the same cost (`_time_as_candidate`).
        guard = state["guard"] = Guard()
        state["guard_ms"] = guard_floor_ms(guard.check_call) if device.type != "cuda" else 0.0
        try:
            state["module"] = load_module("reference", definition.reference, {}, "<reference>")
        except Exception:
            state["module"] = None
            state["error"] = "loading the reference failed:\n" + traceback_tail()
    reference = state["module"]
    if reference is None:
        return {"status": "INVALID_REFERENCE", "message": state["error"]}
    rounds = job.correctness_rounds
    # (seed, digest) per set where the candidate makes the sets again; None: they travel as files
    sets: list[tuple[int, list]] | None = [] if job.regenerate_inputs and regenerable(workload) else None
    batch: dict[str, Any] = {}

    def begin() -> None:
        """The timed sets, made inside the outer clock's window as the candidate's are; the
        reference's own calls there are its work, the rest calibrates the candidate's overhead."""
        if state["clock"] is not None:
            state["clock"].ready(workload.uuid)
        work_s = PHASES.get("reference", 0.0)
        batch["inputs"], batch["sets"] = _timed_sets(job, definition, workload, index, device, reference, sets)
        batch["work_ms"] = (PHASES.get("reference", 0.0) - work_s) * 1e3
        return batch["sets"]  # one timed run per set, as the candidate has

    try:
        for s in range(rounds):
            warm, _ = _reference_set(job, definition, workload, index, s, device, reference, sets)
        with torch.no_grad(), phase("timing"):  # warm-up on the last correctness round, as the candidate
            latency = _time_as_candidate(reference.run, definition, workload, lambda i: batch["inputs"] if i >= 0 else warm,
                                         device, timing_plan(job), state, begin)
    except _SetFailed as failed:
        return {"status": failed.status, "message": failed.message}
    timing_inputs, timed_sets = batch["inputs"], batch["sets"]
    if state["clock"] is not None:
        state["clock"].end(workload.uuid, timed_sets, batch["work_ms"] + latency.total_ms, latency.median_ms)
    result: dict[str, Any] = {"status": "OK", "latency": latency.as_dict(), "timed_sets": timed_sets}
    if sets is not None:  # for the candidate's job: it makes these sets again
        result.update(set_seeds=[seed for seed, _ in sets], set_digests=[made for _, made in sets])
    if job.measure_compile:
        result.update(_time_compiled(reference, definition, workload, timing_inputs, device, job, timed_sets, state))
    return result


def more_sets(job: ReferenceJob, definition: Definition, workloads: dict[int, Workload], device: torch.device,
              state: dict, index: int, first: int, count: int) -> dict[str, Any]:
    """The checker's `more` (a re-timed batch, `retime`): `count` fresh timed sets of workload
    `index` numbered from `first`, each from its own seed, the reference run on each and its
    outputs held for the check. Returns their seeds and digests where the candidate makes them
    again, else `set_seeds` None (saved in the timed sets' folder); `error` where they failed."""
    workload = workloads[index]
    sets: list[tuple[int, list]] | None = [] if job.regenerate_inputs and regenerable(workload) else None
    try:
        for s in range(first, first + count):
            _reference_set(job, definition, workload, index, s, device, state["module"], sets)
    except _SetFailed as failed:
        return {"error": failed.message}
    if sets is None:
        return {"set_seeds": None}
    return {"set_seeds": [seed for seed, _ in sets], "set_digests": [made for _, made in sets]}


def _timed_sets(job: ReferenceJob, definition: Definition, workload: Workload, index: int, device: torch.device,
                reference: ModuleType, sets: list | None) -> tuple[dict[str, Any], int]:
    """The timed runs' input sets, one per timed run, so that no timed run sees values that an
    earlier call saw: a cache keyed on input values, whatever its key, never hits where the time
    is measured, and every timed run's outputs are checked. (Comparing first and repeated uses of
    a set needs a threshold that noise crosses; perturbing a reused set needs the reference again.)
    As many as the plan's timed runs on this device, fewer where they would not fit: beyond
    `timing_sets` of them, a set is made only while the sets so far (inputs and outputs) stay
    under `timed_bytes` and their making under the timing budget, which bounds the candidate's
    memory (it holds each set, the guard's masked copy and the outputs) and the attempt's time.
    Returns the first set (the reference is timed on it) and the number made."""
    first_set = job.correctness_rounds
    wanted = timing_plan(job).wanted_runs(device)
    floor = min(job.timing_sets, wanted)
    began = time.perf_counter()
    first, set_bytes = _reference_set(job, definition, workload, index, first_set, device, reference, sets)
    made = 1
    while made < wanted and (made < floor or ((made + 1) * set_bytes <= job.timed_bytes
                                              and time.perf_counter() - began <= job.timing_budget_s)):
        _reference_set(job, definition, workload, index, first_set + made, device, reference, sets)
        made += 1
    return first, made


# The expected outputs, by set name (`w<i>_s<s>`), kept in this process for its checker role
# (`checker.serve`): on the device while they take at most `DEVICE_SHARE` of its memory, else in
# host memory (moved back one set at a time when checked).
EXPECTED: dict[str, dict[str, Any]] = {}
DEVICE_SHARE = 0.25
_HELD = [0]  # bytes held on the device


def _hold(name: str, outputs: dict[str, Any], device: torch.device) -> None:
    """A copy of the set's outputs: the reference may return a tensor it changes later (an input
    it works in place on, which its timed runs then reuse), and a file saved at once had the values
    of this moment."""
    nbytes = sum(v.nbytes for v in outputs.values() if isinstance(v, torch.Tensor))
    on_device = device.type == "cuda" and (
        _HELD[0] + nbytes <= DEVICE_SHARE * torch.cuda.get_device_properties(device).total_memory)
    if on_device:
        _HELD[0] += nbytes
    EXPECTED[name] = {k: (v.detach().clone() if on_device or v.device.type == "cpu" else v.detach().cpu())
                      if isinstance(v, torch.Tensor) else v for k, v in outputs.items()}


class _SetFailed(Exception):
    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _reference_set(job: ReferenceJob, definition: Definition, workload: Workload, index: int, s: int,
                   device: torch.device, reference: ModuleType, sets: list | None) -> tuple[dict[str, Any], int]:
    """Input set `s`: drawn from its own seed; its seed and digest appended to `sets` where the
    candidate makes it again, else saved for the candidate; the reference's outputs saved where
    the candidate cannot read them. Returns the inputs and the set's bytes (both sides).
    A set on which the reference's own outputs fail the tolerance against themselves (NaN, or -inf
    the workload does not allow) makes the workload INVALID_REFERENCE: no solution could pass it."""
    seed = set_seed(job.seed, index, s)
    try:
        with phase("inputs"):
            inputs = make_inputs(definition, workload, seed, device,
                                 Path(job.problem_root) if job.problem_root else None, reference)
    except InputError as error:
        raise _SetFailed("INPUT_ERROR", str(error)) from None
    except Exception:
        raise _SetFailed("INVALID_REFERENCE", "making inputs failed:\n" + traceback_tail()) from None
    if sets is None:  # a timed set's file hidden until the outer clock's `go`, where the clock is on
        folder = job.timed_dir if s >= job.correctness_rounds else None
        try:
            with phase("save"):
                tensorfile.save(inputs, Path(folder or job.inputs_dir) / f"w{index}_s{s}.st")
        except OSError as error:
            if is_fault(error):  # a full disk or a file size limit: the machine's, not the problem's
                raise _SetFailed(EVALUATOR_FAULT, f"saving input set {s} failed: {error}") from None
            raise
    else:
        with phase("digest"):  # before the reference runs, as the file was saved before it
            sets.append((seed, digest(inputs)))
    try:
        with torch.no_grad(), phase("reference"):
            outputs = as_outputs(definition, reference.run(*inputs.values()))
            synchronize(device)
    except Exception:
        raise _SetFailed("INVALID_REFERENCE", "the reference raised:\n" + traceback_tail()) from None
    differs = off_definition(definition, definition.resolve_axes(workload.axes), outputs)
    if differs:
        raise _SetFailed("INVALID_REFERENCE", f"the reference's outputs on input set {s} do not match the "
                                              f"definition: {differs}. No solution could pass against them.")
    problem = unmatchable(outputs, workload.effective_tolerance)
    if problem:
        raise _SetFailed("INVALID_REFERENCE", f"the reference's outputs on input set {s} cannot be matched, "
                                              f"not even by the reference: {problem}. The workload's inputs take "
                                              f"the reference out of its range.")
    with phase("hold"):
        _hold(f"w{index}_s{s}", outputs, device)
    return inputs, sum(v.nbytes for v in (*inputs.values(), *outputs.values()) if isinstance(v, torch.Tensor))


def _time_as_candidate(fn: Callable[..., Any], definition: Definition, workload: Workload,
                       source: Callable[[int], dict[str, Any]], device: torch.device, plan: TimingPlan,
                       state: dict, begin: Callable[[], object] | None = None) -> Latency:
    """`fn` timed as the candidate's harness times a solution that returns its outputs
    (`candidate.run_candidate`), so that the two sides differ only in the code called: each run on
    a fresh copy of its input set (`source(i)`) with NaN-filled buffers made beside it, untimed;
    its outputs taken as the candidate's (`as_outputs`) and the guard's `check_call` made inside
    the timed call, the check's floor taken off each host sample (`guards.guard_floor_ms`); once
    the run is over, untimed, its outputs copied into those buffers and their own memory freed
    (`entry.hold`), in the same order as there, so that the allocator hands both sides' runs the
    same kind of memory. At most one timed run per timed set, as there. (The check's cost beyond
    its floor varies with what ran before it; both sides making it keeps that on both sides. The
    signal guard's system calls, which cost up to 100 us there, run after the end reading:
    `guards.Guard.check_after_call`.)"""
    check = state["guard"].check_call
    staged: list[Any] = []
    returned: list[tuple[dict[str, Any], dict[str, torch.Tensor]]] = []
    kept: list[dict[str, Any]] = []
    axes = definition.resolve_axes(workload.axes)

    def prepare(i: int) -> None:
        staged.clear()  # the last run's copy freed first, as the candidate's
        staged[:] = [{n: v.clone() if isinstance(v, torch.Tensor) else v for n, v in source(i).items()},
                     empty_holding(definition, axes, device)]
        if returned:
            kept.append(hold(*returned.pop()))

    def run(i: int) -> None:
        outputs = as_outputs(definition, fn(*staged[0].values()))
        if i >= 0:
            returned[:] = [(outputs, staged[1])]
        check()

    try:
        return time_runs(run, device, plan, prepare, begin, state["guard_ms"])
    finally:
        returned.clear()
        kept.clear()


def _time_compiled(reference: ModuleType, definition: Definition, workload: Workload, inputs: dict[str, Any],
                   device: torch.device, job: ReferenceJob, timed_sets: int, state: dict) -> dict[str, Any]:
    """torch.compile on the reference, for T_b, timed as the eager reference is. A reference that
    does not compile has no such time."""
    try:
        compiled = torch.compile(reference.run)
        with torch.no_grad():
            plan = dataclasses.replace(timing_plan(job), max_runs=timed_sets)
            latency = _time_as_candidate(compiled, definition, workload, lambda i: inputs, device, plan, state)
    except Exception:  # any failure of the compiler stack only means there is no compiled baseline
        return {"compile_error": traceback_tail()[-1000:]}
    return {"compile_ms": latency.median_ms}

"""The child process of an attempt: `python -m services.evaluator.child JOB.json`.

Two roles, two separate processes, neither of which is the evaluator itself:
- `reference` (trusted; its code is `reference_role.py`): makes every input set from a seed of its
  own (hashed from the attempt's secret), runs the reference, saves the expected outputs where the
  candidate cannot read them, and times the reference. A workload's sets reach the candidate one of
  two ways: random and scalar inputs as each set's seed and a digest of its values (reported in the
  result, passed on by the parent), which the candidate makes again; safetensors and custom inputs
  as files saved where the candidate can read them.
- `candidate` (untrusted): makes each input set again from its seed and checks its digest (a set
  it cannot make identically is reported, not run), or loads it from its file; runs the solution
  on each set into outputs pre-filled with NaN, saves them, then times it, each timed call on a
  fresh copy of an input set of its own and into fresh NaN-filled outputs. It never sees the
  attempt's secret or the expected outputs; a set's seed gives it only that set's values.

Both time each workload's timed batch inside a window of the evaluator's own clock where it is on
(`outer_clock`: `ready` after the correctness rounds and the warm-up, `end` once the timed
outputs are saved). The timed sets reach the candidate only at the window's `go`: their seeds in
that message, or their files moved into its inputs folder then; before, it has only the
correctness rounds'. The reference makes its timed sets inside its window too, so that its window
less its own calls calibrates the batch's overhead.

Each role writes `result.json` after every workload, so a crash or a timeout keeps what was
done. The parent owns every verdict; the child only reports what happened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from services.evaluator import gpu_handover, tensorfile
from services.evaluator.cutedsl import CompileFailed, CuteEntry
from services.evaluator.entry import as_outputs, cubin_kernels, empty_outputs, load_entry
from services.evaluator.guards import Guard, snapshot
from services.evaluator.inputs import NOT_REPRODUCED, digest, make_inputs
from services.evaluator.launch import foreign_kernels
from services.evaluator.outer_clock import HarnessClock
from services.evaluator.spares import READY_FILE
from services.evaluator.timing import TimingPlan, bind_runtime, sm_clock_mhz, synchronize, time_runs
from shared.schema import Definition, Workload

MAX_TRACEBACK_CHARS = 4000


def main(argv: list[str]) -> int:
    """`child.py JOB.json` runs a job now; `child.py --wait DEVICE` (a spare started ahead of its
    attempt) first imports and initialises the device, then reads the job's path from stdin."""
    if argv[:1] == ["--wait"]:
        _warm_up(argv[1])
        job_path = sys.stdin.readline().strip()
        if not job_path:
            return 0  # the evaluator let this spare go unused
    else:
        job_path = argv[0]
    job = json.loads(Path(job_path).read_text())
    definition = Definition.model_validate(job["definition"])
    workloads = [Workload.model_validate(w) for w in job["workloads"]]
    device = torch.device(job["device"])
    if device.type == "cuda":
        device = torch.device("cuda", device.index or 0)
        torch.cuda.set_device(device)
    result_path = Path(job["result_path"])
    results: list[dict[str, Any]] = []
    untrusted = job["role"] == "candidate"
    if untrusted:
        run = run_candidate
    else:  # the trusted role's code lives apart; it imports this module's phases and helpers
        from services.evaluator.reference_role import run_reference as run
    state: dict[str, Any] = {"clock": HarnessClock.from_job(job)}  # before the solution loads
    try:
        for index, workload in zip(job["indices"], workloads):
            results.append({"uuid": workload.uuid, **run(job, definition, workload, index, device, state)})
            _write_json(result_path, {"workloads": results, "phases": {k: round(v, 4) for k, v in PHASES.items()}})
    except BaseException:  # the solution's SystemExit, say: still no exit handler of its own runs
        if not untrusted:
            raise
        traceback.print_exc()
        _exit_now(1)
    if untrusted:
        _exit_now(0)
    if isinstance(job.get("checker_fd"), int):  # the reference's process becomes the attempt's checker
        from services.evaluator import checker, reference_role

        sock, reader = state["clock"].channel() if state["clock"] is not None else checker.open_channel(job["checker_fd"])
        checker.serve(sock, reader, job, definition, dict(zip(job["indices"], workloads)),
                      reference_role.EXPECTED, device)
    return 0


def _exit_now(code: int, _exit=os._exit) -> None:
    """The candidate's end: no atexit handler, finalizer or `__del__` of the solution runs after
    its last result was written (they could rewrite it). `_exit` is bound before the solution loads."""
    sys.stdout.flush()
    sys.stderr.flush()
    _exit(code)


PHASES: dict[str, float] = {}  # seconds spent per phase, reported beside the results (diagnostics)
_ACTIVE: list[list[float]] = []  # [began, seconds in the phases inside it] per phase entered


@contextlib.contextmanager
def _phase(name: str):
    """A phase's own seconds: those of the phases entered inside it are theirs."""
    frame = [time.perf_counter(), 0.0]
    _ACTIVE.append(frame)
    try:
        yield
    finally:
        _ACTIVE.pop()
        spent = time.perf_counter() - frame[0]
        PHASES[name] = PHASES.get(name, 0.0) + spent - frame[1]
        if _ACTIVE:
            _ACTIVE[-1][1] += spent


def _warm_up(device_name: str) -> None:
    """What every job needs before it starts: torch imported, the device's context created."""
    device = torch.device(device_name)
    if device.type == "cuda":
        torch.cuda.set_device(torch.device("cuda", device.index or 0))
        torch.empty(1, device=device)
    Path(READY_FILE).touch()  # in its home: the evaluator waits for this before any timing starts


def run_candidate(job: dict, definition: Definition, workload: Workload, index: int,
                  device: torch.device, state: dict) -> dict[str, Any]:
    try:
        if "entry" not in state:
            if job.get("language") == "cute_dsl":
                import cutlass.cute  # noqa: F401  (trusted, and before the guard's snapshot)
            bind_runtime(device)  # what the timer resets persisting L2 lines with, before the guard's snapshot
            # Output sets shared in GPU memory where the job says so and cuda-python is here (else files).
            state["share"] = bool(job.get("gpu_handover")) and state["clock"] is not None \
                and device.type == "cuda" and gpu_handover.bind(device)
            guard = state["guard"] = Guard()  # before the solution's code runs at all
            # The verdict's own path, bound before the solution may rebind this module's names.
            state["verdict"] = (_enforce, guard.check, guard.check_inputs, guard.check_outputs, guard.check_call)
            state["entry"] = load_entry(job)
            state["verdict"][0](state["verdict"][1]())
        enforce, check, check_inputs, check_outputs, check_call = state["verdict"]
        entry = state["entry"]
        dps = job["destination_passing_style"]
        outputs_dir = Path(job["outputs_dir"])
        rounds, timed_sets = job["correctness_rounds"], dict(zip(job["indices"], job["timed_sets"]))[index]
        axes = definition.resolve_axes(workload.axes)
        share = state["share"]
        held: dict[int, dict[str, Any]] = {}  # output sets kept on the device until `sealed`, where shared
        inputs: dict[str, Any] | None = None
        for s in range(rounds):
            inputs = _input_set(job, definition, workload, index, s, device)
            before = snapshot(inputs)
            outputs = _call(entry, definition, axes, inputs, dps, device)
            enforce(check() or check_inputs(before, inputs) or check_outputs(outputs))
            if share:  # a copy of this moment's values (a later call may reuse the solution's buffers)
                held[s] = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in outputs.items()}
                continue
            with _phase("save"):
                tensorfile.save(outputs, outputs_dir / f"w{index}_s{s}.st")
        timed: list[dict[str, Any]] = []
        timed_before: list[Any] = []  # the sources of every timed copy stay as they came
        clock = state["clock"]

        def hand_over() -> None:
            """The timed sets, once the outer clock said `go` (its seeds arrive with it) where it is on."""
            if clock is not None:
                _take_timed_seeds(job, index, clock.ready(workload.uuid))
            timed[:] = [_input_set(job, definition, workload, index, rounds + t, device) for t in range(timed_sets)]
            timed_before[:] = [snapshot(t) for t in timed]

        if clock is None:
            hand_over()
        warm = inputs  # the warm-up runs repeat the last correctness round: no timed set is seen before its run
        staged: list[tuple[dict[str, Any], dict[str, torch.Tensor]]] = []
        last: dict[int, dict[str, Any]] = {}

        def prepare(i: int) -> None:
            """Untimed: a copy of the run's input set at new addresses and outputs pre-filled with
            NaN. Timed run i has set i to itself; an address used before holds other values now."""
            source = timed[i] if i >= 0 else warm
            fresh = {n: v.clone() if isinstance(v, torch.Tensor) else v for n, v in source.items()}
            staged[:] = [(fresh, empty_outputs(definition, axes, device))]

        def run(i: int) -> None:
            inputs, buffers = staged[-1]
            outputs = _invoke(entry, inputs, buffers, dps, definition)
            if i >= 0:
                last[i] = outputs
            enforce(check_call())  # before the timer's end reading

        plan = dataclasses.replace(_plan(job), max_runs=timed_sets,
                                   warmup_runs=job["warmup_runs"] if warm is not None else 0)
        clock_before = sm_clock_mhz(device)
        with _phase("timing"):
            latency = time_runs(run, device, plan, prepare, hand_over if clock is not None else None)
        clock_after = sm_clock_mhz(device)
        own = cubin_kernels(entry)
        if own is not None:  # a `cuda` solution: the kernels its timed runs ran must be its own
            enforce(foreign_kernels(latency.kernels, own.defines))
        for t, outputs in last.items():  # inside the outer clock's window: the outputs exist at `end`
            enforce(check_outputs(outputs))
            if share:
                held[rounds + t] = outputs
                continue
            with _phase("save"):
                tensorfile.save(outputs, outputs_dir / f"w{index}_s{rounds + t}.st")
        shared, keep = _share(held, device, outputs_dir, index)
        if clock is not None:
            clock.end(workload.uuid, latency.runs, latency.total_ms, latency.median_ms, shared)
        del keep, held
        enforce(check())
        for before, after in zip(timed_before, timed):
            enforce(check_inputs(before, after))
    except HackDetected as hack:
        return {"status": "REWARD_HACK", "message": str(hack)}
    except _NotReproduced as differs:  # the solution's doing where the guard sees why
        violation = state["verdict"][1]()
        if violation:
            return {"status": "REWARD_HACK", "message": violation}
        return {"status": NOT_REPRODUCED, "message": str(differs)}
    except CompileFailed as refused:  # cute_dsl: `cute.compile` refused it
        return {"status": "COMPILE_ERROR", "message": str(refused)}
    except Exception:
        return {"status": "RUNTIME_ERROR", "message": _traceback()}
    finally:
        if isinstance(state.get("entry"), CuteEntry):
            PHASES["compile"] = round(state["entry"].compile_s, 4)
    if not math.isfinite(latency.median_ms):
        return {"status": "RUNTIME_ERROR", "message": "timing produced no finite latency"}
    timing = {**latency.as_dict(), "sm_clock_mhz_before": clock_before, "sm_clock_mhz_after": clock_after}
    return {"status": "OK", "latency": timing}


class HackDetected(Exception):
    pass


class _NotReproduced(Exception):
    pass


def _input_set(job: dict, definition: Definition, workload: Workload, index: int, s: int,
               device: torch.device) -> dict[str, Any]:
    """Input set `s` of the workload: made again from its seed where the job gives the seeds, and
    then identical to the reference's (its digest) or refused; else loaded from its file."""
    k = job["indices"].index(index)
    seeds, digests = job["set_seeds"][k], job["set_digests"][k]
    if seeds is None:
        with _phase("load"):
            return tensorfile.load(Path(job["inputs_dir"]) / f"w{index}_s{s}.st", device)
    with _phase("inputs"):
        inputs = make_inputs(definition, workload, seeds[s], device, None, None)
    with _phase("digest"):
        made = digest(inputs)
    if made != digests[s]:
        differ = [str(ours[0]) for ours, theirs in zip(made, digests[s]) if ours != theirs] or ["the set's layout"]
        raise _NotReproduced(f"input set {s} could not be made again identically in the candidate's process "
                             f"({', '.join(differ)}: another digest than in the reference's process); not the "
                             f"solution's fault: the workload's inputs do not come out the same from the same "
                             f"seed in two processes on this device")
    return inputs


def _share(held: dict[int, dict[str, Any]], device: torch.device, outputs_dir: Path,
           index: int) -> tuple[dict[int, Any] | None, list]:
    """The held output sets' descriptors (`gpu_handover.export_set`), once the device is idle (no
    work of the solution's still writing them); a set that cannot be shared is saved to its file.
    Returns None where nothing is held (files only) and what must stay alive until `sealed`."""
    if not held:
        return None, []
    shared: dict[int, Any] = {}
    keep: list = []
    synchronize(device)
    with _phase("export"):
        for s, outputs in held.items():
            exported = gpu_handover.export_set(outputs, device)
            if exported is None:
                tensorfile.save(outputs, outputs_dir / f"w{index}_s{s}.st")
                continue
            shared[s], kept = exported
            keep.extend(kept)
    return shared, keep


def _take_timed_seeds(job: dict, index: int, go: dict[str, Any]) -> None:
    """The timed sets' seeds and digests, which the outer clock's `go` carries (None: files)."""
    k = job["indices"].index(index)
    if go.get("set_seeds") is not None:
        job["set_seeds"][k] = [*job["set_seeds"][k], *go["set_seeds"]]
        job["set_digests"][k] = [*job["set_digests"][k], *go["set_digests"]]


def _enforce(violation: str | None) -> None:
    if violation:
        raise HackDetected(violation)


def _call(entry, definition: Definition, axes: dict[str, int], inputs: dict[str, Any], dps: bool,
          device: torch.device) -> dict[str, Any]:
    buffers = empty_outputs(definition, axes, device)
    outputs = _invoke(entry, inputs, buffers, dps, definition)
    synchronize(device)
    return outputs


def _invoke(entry, inputs: dict[str, Any], buffers: dict[str, torch.Tensor], dps: bool,
            definition: Definition) -> dict[str, Any]:
    if dps:
        entry(*inputs.values(), *buffers.values())
        return buffers
    return as_outputs(definition, entry(*inputs.values()))


def _plan(job: dict) -> TimingPlan:
    return TimingPlan(job["warmup_runs"], job["timing_runs"], job["timing_budget_s"])


def _traceback() -> str:
    text = traceback.format_exc()
    return text if len(text) <= MAX_TRACEBACK_CHARS else "...\n" + text[-MAX_TRACEBACK_CHARS:]


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


if __name__ == "__main__":
    # Run as a script, this module is `__main__`: the guards watch it under its own name too.
    sys.modules["services.evaluator.child"] = sys.modules[__name__]
    sys.exit(main(sys.argv[1:]))

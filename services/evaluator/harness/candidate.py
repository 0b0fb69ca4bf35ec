"""The candidate's role in its child (untrusted code runs here): makes each input set again from
its seed and checks its digest (a set it cannot make identically is reported, not run), or loads it
from its file; runs the solution on each set into outputs pre-filled with NaN, saves them, then
times it, each timed call on a fresh copy of an input set of its own and into fresh NaN-filled
outputs, inside the outer clock's window where it is on (`harness/main.py` says the whole child).
Every `end` is answered: where the evaluator answers `again` (the window over its allowance,
`retime`), it times the workload again on the fresh sets that carries, and reports the last batch.
It never sees the attempt's secret or the expected outputs; a set's seed gives it only that set's
values.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import torch

from services.evaluator.harness import gpu_handover, tensorfile
from services.evaluator.languages import CompiledEntry, CompileFailed, entry_for
from services.evaluator.harness.entry import as_outputs, cubin_kernels, empty_holding, empty_outputs, hold, load_entry
from services.evaluator.harness.guards import Guard, guard_floor_ms, snapshot
from services.evaluator.harness.inputs import NOT_REPRODUCED, digest, make_inputs
from services.evaluator.languages.launch import foreign_kernels
from services.evaluator.harness.phases import PHASES, phase, timing_plan, traceback_tail
from services.evaluator.harness.timing import bind_runtime, cupti_recorder, sm_clock_mhz, synchronize, time_runs
from services.evaluator.protocol import CandidateJob
from shared.schema import Definition, Workload



def run_candidate(job: CandidateJob, definition: Definition, workload: Workload, index: int,
                  device: torch.device, state: dict) -> dict[str, Any]:
    try:
        if "entry" not in state:
            state["setup"] = time.perf_counter()
            entry_for(job.language).preload()  # trusted imports, before the guard's snapshot
            bind_runtime(device)  # what the timer resets persisting L2 lines with, before the guard's snapshot
            if device.type == "cuda":  # the timer's CUPTI set up before the signal guard's snapshot too
                cupti_recorder()
            # Output sets shared in GPU memory where the job says so and cuda-python is here (else files).
            state["share"] = bool(job.gpu_handover) and state["clock"] is not None \
                and device.type == "cuda" and gpu_handover.bind(device)
            guard = state["guard"] = Guard()  # before the solution's code runs at all
            # What the guard's check inside every timed call costs at least, taken off the host's
            # samples: measured now, before the solution could change what the check reads.
            state["guard_ms"] = guard_floor_ms(guard.check_call) if device.type != "cuda" else 0.0
            # The verdict's own path, bound before the solution may rebind this module's names.
            state["verdict"] = (_enforce, guard.check, guard.check_inputs, guard.check_outputs, guard.check_call,
                                guard.after_import, guard.check_signals, guard.check_after_call)
            state["entry"] = load_entry(job)
            # Signal handlers it installed at import are allowed (honest libraries install some);
            # a timer armed or a signal pending then is not.
            state["verdict"][0](state["verdict"][5]() or state["verdict"][1]())
            PHASES["setup"] = round(time.perf_counter() - state["setup"], 4)  # imports, CUPTI, loading
        enforce, check, check_inputs, check_outputs, check_call, _, check_signals, after_call = state["verdict"]
        entry = state["entry"]
        if hasattr(entry, "select"):  # a `cuda` solution's launch plans replayed (timer/replay.py)
            entry.select(workload.uuid)
        dps = job.destination_passing_style
        outputs_dir = Path(job.outputs_dir)
        rounds, timed_sets = job.correctness_rounds, dict(zip(job.indices, job.timed_sets))[index]
        axes = definition.resolve_axes(workload.axes)
        k = job.indices.index(index)
        given = [job.set_seeds[k], job.set_digests[k]]  # the timed sets' are added at the clock's `go`
        share = state["share"]
        held: dict[int, dict[str, Any]] = {}  # output sets kept on the device until `sealed`, where shared
        inputs: dict[str, Any] | None = None
        for s in range(rounds):
            inputs = _input_set(job, definition, workload, index, s, device, given)
            before = snapshot(inputs)
            outputs = _call(entry, definition, axes, inputs, dps, device)
            enforce(check() or check_inputs(before, inputs) or check_outputs(outputs))
            if share:  # a copy of this moment's values (a later call may reuse the solution's buffers)
                held[s] = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in outputs.items()}
                continue
            with phase("save"):
                tensorfile.save(outputs, outputs_dir / f"w{index}_s{s}.st")
        timed: list[dict[str, Any]] = []
        timed_before: list[Any] = []  # the sources of every timed copy stay as they came
        clock = state["clock"]

        def hand_over() -> None:
            """The timed sets, once the outer clock said `go` (its seeds arrive with it) where it is on."""
            if clock is not None:
                given[:] = _with_timed_seeds(given, clock.ready(workload.uuid))
            timed[:] = [_input_set(job, definition, workload, index, rounds + t, device, given)
                        for t in range(timed_sets)]
            timed_before[:] = [snapshot(t) for t in timed]

        if clock is None:
            hand_over()
        warm = inputs  # the warm-up runs repeat the last correctness round: no timed set is seen before its run
        staged: list[tuple[dict[str, Any], dict[str, torch.Tensor]]] = []
        last: dict[int, dict[str, Any]] = {}
        returned: list[tuple[int, dict[str, Any], dict[str, torch.Tensor]]] = []  # the last timed run's

        def prepare(i: int) -> None:
            """Untimed: a copy of the run's input set at new addresses and outputs pre-filled with
            NaN (the buffers of a destination-passing call; else where its returned outputs are
            copied). Timed run i has set i to itself; an address used before holds other values now."""
            source = timed[i] if i >= 0 else warm
            staged.clear()  # the last run's copy freed first: one copy of a set alive at a time
            fresh = {n: v.clone() if isinstance(v, torch.Tensor) else v for n, v in source.items()}
            staged[:] = [(fresh, (empty_outputs if dps else empty_holding)(definition, axes, device))]
            settle()  # after this run's memory was taken: the last run's outputs' memory is free for it

        def settle() -> None:
            """The last timed run's returned outputs checked, then copied into the buffers made
            before it (`hold`): their values as at the end of that run, and their memory free for
            the next run, as the reference's timed runs have it (`reference_role._time_as_candidate`)."""
            if returned:
                t, outputs, buffers = returned.pop()
                enforce(check_outputs(outputs))  # plain tensors: copying them runs no code of the solution's
                last[t] = outputs if dps else hold(outputs, buffers)

        def run(i: int) -> None:
            inputs, buffers = staged[-1]
            outputs = _invoke(entry, inputs, buffers, dps, definition)
            if i >= 0:
                returned[:] = [(i, outputs, buffers)]
            enforce(check_call())  # before the timer's end reading

        def ended(i: int) -> None:
            enforce(after_call())  # right after the timer's end reading

        plan = dataclasses.replace(timing_plan(job), max_runs=timed_sets,
                                   warmup_runs=job.warmup_runs if warm is not None else 0)
        begin = hand_over if clock is not None else None
        first = rounds  # the set number of the batch's first timed set
        clock_before = sm_clock_mhz(device)
        while True:  # one timed batch; again where the outer clock re-times it (`retime`)
            with phase("timing"):
                latency = time_runs(run, device, plan, prepare, begin, state["guard_ms"], ended)
                settle()
            clock_after = sm_clock_mhz(device)
            own = cubin_kernels(entry)
            if own is not None:  # a `cuda` solution: the kernels its timed runs ran must be its own
                enforce(foreign_kernels(latency.kernels, own.defines))
            for t, outputs in last.items():  # inside the outer clock's window: the outputs exist at `end`
                enforce(check_outputs(outputs))
                if share:
                    held[first + t] = outputs
                    continue
                with phase("save"):
                    tensorfile.save(outputs, outputs_dir / f"w{index}_s{first + t}.st")
            enforce(check_signals())  # nothing left to run after the batch's last timer reading, before `end`
            shared, keep = _share(held, device, outputs_dir, index)
            again = clock.end(workload.uuid, latency.runs, latency.total_ms, latency.median_ms, shared) \
                if clock is not None else None
            del keep
            held = {}
            last.clear()
            enforce(check())
            for before, after in zip(timed_before, timed):
                enforce(check_inputs(before, after))
            if again is None:
                break
            # Timed again, in a window open since `again`: fresh sets (their seeds in it, or their
            # files moved into the inputs folder), each run on a fresh copy as before, no warm-up.
            first = int(again["first"])
            given[:] = _with_timed_seeds(given, again)
            timed[:] = [_input_set(job, definition, workload, index, first + t, device, given)
                        for t in range(timed_sets)]
            timed_before[:] = [snapshot(t) for t in timed]
            plan, begin = dataclasses.replace(plan, warmup_runs=0), None
    except HackDetected as hack:
        return {"status": "REWARD_HACK", "message": str(hack)}
    except _NotReproduced as differs:  # the solution's doing where the guard sees why
        violation = state["verdict"][1]()
        if violation:
            return {"status": "REWARD_HACK", "message": violation}
        return {"status": NOT_REPRODUCED, "message": str(differs)}
    except CompileFailed as refused:  # a language compiling in the child (cute_dsl) refused it
        return {"status": "COMPILE_ERROR", "message": str(refused)}
    except Exception:
        return {"status": "RUNTIME_ERROR", "message": traceback_tail()}
    finally:
        if isinstance(state.get("entry"), CompiledEntry):
            PHASES["compile"] = round(state["entry"].compile_s, 4)
    if not math.isfinite(latency.median_ms):
        return {"status": "RUNTIME_ERROR", "message": "timing produced no finite latency"}
    timing = {**latency.as_dict(), "sm_clock_mhz_before": clock_before, "sm_clock_mhz_after": clock_after,
              **({"guard_ms": round(state["guard_ms"], 6)} if state["guard_ms"] else {})}
    return {"status": "OK", "latency": timing}


class HackDetected(Exception):
    pass


class _NotReproduced(Exception):
    pass


def _input_set(job: CandidateJob, definition: Definition, workload: Workload, index: int, s: int,
               device: torch.device, given: list) -> dict[str, Any]:
    """Input set `s` of the workload: made again from its seed where `given` (seeds, digests) has
    them, and then identical to the reference's (its digest) or refused; else loaded from its file."""
    seeds, digests = given
    if seeds is None:
        with phase("load"):
            return tensorfile.load(Path(job.inputs_dir) / f"w{index}_s{s}.st", device)
    with phase("inputs"):
        inputs = make_inputs(definition, workload, seeds[s], device, None, None)
    with phase("digest"):
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
    with phase("export"):
        for s, outputs in held.items():
            exported = gpu_handover.export_set(outputs, device)
            if exported is None:
                tensorfile.save(outputs, outputs_dir / f"w{index}_s{s}.st")
                continue
            shared[s], kept = exported
            keep.extend(kept)
    return shared, keep


def _with_timed_seeds(given: list, go: dict[str, Any]) -> list:
    """(seeds, digests) with the timed sets' added, which the outer clock's `go` carries (None: files)."""
    seeds, digests = given
    if go.get("set_seeds") is None:
        return given
    return [[*seeds, *go["set_seeds"]], [*digests, *go["set_digests"]]]


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

"""The child process of an attempt: `python -m services.evaluator.harness JOB.json`.

Two roles, two separate processes, neither of which is the evaluator itself:
- `reference` (trusted; its code is `reference_role.py`): makes every input set from a seed of its
  own (hashed from the attempt's secret), runs the reference, saves the expected outputs where the
  candidate cannot read them, and times the reference. A workload's sets reach the candidate one of
  two ways: random and scalar inputs as each set's seed and a digest of its values (reported in the
  result, passed on by the parent), which the candidate makes again; safetensors and custom inputs
  as files saved where the candidate can read them.
- `candidate` (untrusted; its code is `candidate.py`): makes each input set again from its seed and checks its digest (a set
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

import os
import functools
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

from services.evaluator.harness.candidate import run_candidate
from services.evaluator.harness.clock import HarnessClock
from services.evaluator.harness.phases import write_results
from services.evaluator.protocol import EVALUATOR_FAULT, READY_FILE, WorkloadResult, read_job


def main(argv: list[str]) -> int:
    """`python -m services.evaluator.harness JOB.json` runs a job now; `... --wait DEVICE` (a spare
    started ahead of its attempt) first imports and initialises the device, then reads the job's
    path from stdin."""
    fault = None
    if argv[:1] == ["--wait"]:
        fault = _warm_up(argv[1])
        job_path = sys.stdin.readline().strip()
        if not job_path:
            return 0  # the evaluator let this spare go unused
    else:
        job_path = argv[0]
    job = read_job(Path(job_path).read_bytes())
    definition, workloads = job.definition, job.workloads
    result_path = Path(job.result_path)
    device = torch.device(job.device)
    if device.type == "cuda":
        device = torch.device("cuda", device.index or 0)
    fault = fault or _use_device(device)
    if fault is not None:  # before any code of the job's runs: the machine's fault, no verdict
        write_results(result_path, [WorkloadResult(uuid=w.uuid, status=EVALUATOR_FAULT, message=fault)
                                    for w in workloads])
        return 0
    results: list[WorkloadResult] = []
    untrusted = job.role == "candidate"
    if untrusted and job.mode == "record":  # language `cuda`: its launch plans only (timer/)
        from services.evaluator.harness.record_role import run_record as run
    elif untrusted:
        run = run_candidate
    else:  # the trusted role's code: never imported by a candidate started as a new interpreter
        from services.evaluator.harness.reference_role import run_reference as run
    state: dict[str, Any] = {"clock": HarnessClock.from_job(job)}  # before the solution loads
    try:
        for index, workload in zip(job.indices, workloads):
            results.append(WorkloadResult(uuid=workload.uuid, **run(job, definition, workload, index, device, state)))
            write_results(result_path, results)
    except BaseException:  # the solution's SystemExit, say: still no exit handler of its own runs
        if not untrusted:
            raise
        traceback.print_exc()
        _exit_now(1)
    if untrusted:
        _exit_now(0)
    if isinstance(job.checker_fd, int):  # the reference's process becomes the attempt's checker
        from services.evaluator.harness import checker
        from services.evaluator.harness.reference_role import EXPECTED, more_sets

        sock, reader = state["clock"].channel() if state["clock"] is not None else checker.open_channel(job.checker_fd)
        by_index = dict(zip(job.indices, workloads))
        make_sets = functools.partial(more_sets, job, definition, by_index, device, state)
        checker.serve(sock, reader, job, definition, by_index, EXPECTED, device, make_sets)
    return 0


def _exit_now(code: int, _exit=os._exit) -> None:
    """The candidate's end: no atexit handler, finalizer or `__del__` of the solution runs after
    its last result was written (they could rewrite it). `_exit` is bound before the solution loads."""
    sys.stdout.flush()
    sys.stderr.flush()
    _exit(code)


def _warm_up(device_name: str) -> str | None:
    """What every job needs before it starts: torch imported, the device's context created. What
    went wrong making it, if anything (the job then reports it: `_use_device`)."""
    device = torch.device(device_name)
    if device.type == "cuda":
        device = torch.device("cuda", device.index or 0)
    fault = _use_device(device)
    Path(READY_FILE).touch()  # in its home: the evaluator waits for this before any timing starts
    return fault


def _use_device(device: torch.device) -> str | None:
    """The device made current and its context created, or why it could not be: a CUDA context that
    cannot be made (no driver, the GPU lost or taken, its memory full) is the evaluator's machine's
    fault, not the code's it was about to run (`EVALUATOR_FAULT`)."""
    if device.type != "cuda":
        return None
    try:
        torch.cuda.set_device(device)
        torch.empty(1, device=device)
    except Exception as error:  # torch raises RuntimeError, AssertionError (no CUDA build), ...
        return f"the evaluator could not use {device} here: {type(error).__name__}: {error}"[:2000]
    return None

"""Verdicts on what the children reported: every output set the candidate left checked against the
reference's (`check_sets`, run in the checker: the reference's process, which holds the expected
outputs), the count of timed runs held against the sets made for them, and what a failing
reference means on this device."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from services.evaluator.harness import tensorfile
from services.evaluator.harness.correctness import Check, compare
from shared.schema import Definition, Problem, Status, Tolerance


def timed_runs(result: dict[str, Any], timed_sets: int) -> int:
    """The timed runs the candidate reports (each on its own input set, each to be checked); a
    count that its sets cannot account for is -1, which fails the check."""
    runs = result.get("latency", {}).get("runs")
    return runs if isinstance(runs, int) and 1 <= runs <= timed_sets else -1


def checked_sets(rounds: int, runs: int, first: int | None = None) -> range:
    """The set numbers a check reads: every correctness round and timed run, or with `first` (a
    re-timed batch) the `runs` sets from `first`."""
    return range(rounds + max(0, runs)) if first is None else range(first, first + max(0, runs))


def check_sets(definition: Definition, tolerance: Tolerance, index: int, rounds: int, runs: int,
               outputs: Path | dict[int, int], expected_sets: dict[str, dict[str, Any]], device: torch.device,
               shared: dict[int, dict[str, Any]] | None = None, importer: Any = None,
               first: int | None = None) -> Check:
    """Every correctness round and the outputs of every timed run (`runs`: each had its own input
    set), every output tensor, as the files are now: each is copied into this process's memory
    before it is read (`read_regular`), so that what is checked is what existed at this moment.
    The checker runs this at the candidate's `end` where the outer clock is on. A set with no
    such file has `Check.missing` set (the evaluator asks later whether it appeared after). Sets in
    `shared` (set number -> descriptor) are in the candidate's GPU memory instead: `importer`
    (`gpu_handover.Importer`) copies them. With `first` (a re-timed batch): only the `runs` sets
    from set `first` (its correctness rounds were checked with the first batch). `outputs`: the
    candidate's output folder, or (the checker's case) set number -> a descriptor of its file, which
    the evaluator opened (`children.open_sets`); a set without one left no file."""
    worst_abs = worst_rel = 0.0
    ratio = 1.0
    for s in checked_sets(rounds, runs, first):
        name = f"w{index}_s{s}"
        expected = expected_sets[name]
        phase = "correctness round" if s < rounds else "timed run on input set"
        if shared is not None and s in shared:
            actual = importer.load(shared[s], expected)
            if isinstance(actual, Check):
                return Check(actual.status, f"{phase} {s}: {actual.message}")
        else:
            source = outputs.get(s) if isinstance(outputs, dict) else outputs / f"{name}.st"
            copy = read_regular(source, _set_limit(expected)) if source is not None else None
            if copy is None:
                return Check(Status.RUNTIME_ERROR, f"the solution left no outputs for {phase} {s}", missing=s)
            if isinstance(copy, Oversized):
                return _oversized(definition, phase, s, copy, expected)
            try:
                actual = tensorfile.loads(copy, device)
            except Exception as error:  # the file is the candidate's: unreadable means it was tampered with
                return Check(Status.RUNTIME_ERROR, f"the outputs of input set {s} are unreadable: {error}")
        for output in definition.outputs:
            want = expected[output].to(device) if isinstance(expected[output], torch.Tensor) else expected[output]
            check = compare(output, actual.get(output), want, tolerance)
            if check.status is not Status.PASSED:
                return Check(check.status, f"{phase} {s}: {check.message}", check.max_absolute_error,
                             check.max_relative_error, check.matched_ratio)
            worst_abs = max(worst_abs, check.max_absolute_error)
            worst_rel = max(worst_rel, check.max_relative_error)
            ratio = min(ratio, check.matched_ratio)
    return Check(Status.PASSED, "", worst_abs, worst_rel, ratio)


def _set_limit(expected: dict[str, Any]) -> int:
    """The most bytes a candidate's output file for a set may hold to be read whole: what the
    expected outputs take, plus a header's room."""
    return sum(v.nbytes for v in expected.values() if isinstance(v, torch.Tensor)) + (1 << 20)


@dataclass(frozen=True)
class Oversized:
    """An output file larger than its outputs can be: only its header was kept, which says what
    it holds (`_oversized` turns it into the shape or dtype it got wrong, or a hack where its
    outputs are right and the rest is padding)."""
    header: bytes


MAX_HEADER = 1 << 20


def read_regular(path: Path | int, limit: int) -> bytearray | Oversized | None:
    """The file's bytes if it is a regular file (not a link, a pipe or a device: the candidate
    names them) of at most `limit` bytes; its header only if larger; None if it is not there or
    not a regular file. Later writes, through the path or a descriptor opened before, change
    nothing in what this returns. `path` may be a descriptor the evaluator opened the same way
    (`children.open_sets`), read from its start; it stays open (its owner closes it)."""
    try:
        if isinstance(path, int):
            os.lseek(path, 0, os.SEEK_SET)
            fd = os.dup(path)
        else:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with open(fd, "rb", buffering=0) as file:
            info = os.fstat(file.fileno())
            if not stat.S_ISREG(info.st_mode):
                return None
            if info.st_size <= limit:
                data = bytearray(info.st_size)  # writable: the checks view it without a copy
                got = file.readinto(data)
                return data if got == info.st_size else data[:got]
            head = file.read(8)
            return Oversized(head + file.read(min(int.from_bytes(head, "little"), MAX_HEADER)))
    except OSError:
        return None


def _oversized(definition: Definition, phase: str, s: int, copy: Oversized, expected: dict[str, Any]) -> Check:
    """A timed output file larger than its outputs can be: the output it got the shape or dtype
    of wrong, from its header; if none, it carried bytes beyond its outputs, which the harness
    never writes."""
    try:
        actual = tensorfile.loads(copy.header, header_only=True)
    except Exception as error:  # noqa: BLE001 - the candidate's file: unreadable, whatever the reason
        return Check(Status.RUNTIME_ERROR, f"the outputs of input set {s} are unreadable: {error}")
    for name in definition.outputs:
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

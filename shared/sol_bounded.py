"""Counting a problem's work in a confined child process with a memory and a time limit.

`shared.sol_count.count_work` runs the reference: on meta tensors that costs nothing, but a
reference that needs values runs on the CPU with real tensors, and one that materialises a huge
intermediate, or loops, would take the caller's memory or time with it (three quantisation
problems of SOL-ExecBench took 22 GB of a 24 GB machine and ended other processes). A reference is
also untrusted text (a submitted problem's): it runs only in `python -m shared.sol_child`, started
by a `CountRunner` that the caller must hand over, the evaluator's sandbox
(`services.evaluator.sandbox.counting`: the confinement a candidate gets, its own scratch folder,
the problems' folders read-only) at every entry point; there is no default that would run it
unconfined. The child sets `RLIMIT_AS` on itself before it imports torch and a soft alarm per
workload; this process ends it (and all it started) when a workload makes no progress for the time
limit plus a grace, or once it has every result, without waiting for its pipes to close. A
workload it cannot count gets a `Counted` without work, with the reason (`UnknownReason`) and a
message, never an exception, and the child is started again for the workloads after it.

The limits (`CountLimits`) come from the settings `sol_count_memory_mb` and `sol_count_time_s`.
The address-space limit counts virtual memory: the child with torch imported reserves about
0.8 GB before it counts anything (measured on torch 2.13 CPU, docs/sol.md).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from shared.hardware import Precision
from shared.schema import Definition, Workload
from shared.sol_count import DEFAULT_CPU_BUDGET_BYTES, SolCountError, WorkCount

DEFAULT_MEMORY_MB = 6144
DEFAULT_TIME_S = 120.0
GRACE_S = 10.0  # past the child's own alarm, before the hard kill
STDERR_TAIL = 2000
CHILD_MODULE = "shared.sol_child"


class UnknownReason(str, Enum):
    """Why a workload has no T_sol."""

    MEMORY = "memory"  # the count needed more than the memory limit
    TIME = "time"  # it ran past the time limit
    COUNT = "count"  # the reference cannot be counted (missing data, runs nowhere, a bad formula)
    CRASH = "crash"  # the counting process died without saying why


class SolUnknownError(SolCountError):
    """A workload's T_sol is unknown, with the reason."""

    def __init__(self, message: str, reason: UnknownReason) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class CountLimits:
    memory_mb: int = DEFAULT_MEMORY_MB  # the child's address space (RLIMIT_AS), torch's reservations included
    time_s: float = DEFAULT_TIME_S  # per workload
    cpu_budget_bytes: int = DEFAULT_CPU_BUDGET_BYTES  # declared inputs made with real values at most
    grace_s: float = GRACE_S  # past the child's own alarm, before the hard kill

    @classmethod
    def from_settings(cls, settings: Any) -> CountLimits:
        return cls(settings.sol_count_memory_mb, settings.sol_count_time_s)


class CountChild(Protocol):
    """A started `python -m shared.sol_child`, confined by the runner that started it."""

    results_fd: int  # this process's end of the channel the child writes its result lines to

    def exit_code(self) -> int | None:
        """Its exit code once it has ended (negative: the signal), else None."""

    def stop(self, wait_s: float) -> int | None:
        """Wait up to `wait_s` for it to end by itself, then kill it and every process it started
        (a daemon in a session of its own included); its exit code."""

    def log_tail(self) -> str:
        """The end of what it (and the reference) wrote to stdout and stderr."""


class CountRunner(Protocol):
    """What starts the counting child: the evaluator's sandbox (`services.evaluator.sandbox.counting`)."""

    def start(self, request: dict[str, Any], problem_roots: Sequence[Path], memory_mb: int) -> CountChild:
        """`python -m shared.sol_child` (`CHILD_MODULE`), confined, with `problem_roots` readable,
        an address space of `memory_mb`, and `request` (JSON-able; the runner adds `results_fd`,
        the child's descriptor of the results channel) on its stdin."""


@dataclass(frozen=True)
class Counted:
    """One workload's count, or why there is none."""

    uuid: str
    work: WorkCount | None
    reason: UnknownReason | None = None
    message: str | None = None
    peak_mb: int | None = None  # the child's peak address space when it reported this workload

    def unwrap(self) -> WorkCount:
        if self.work is None:
            raise SolUnknownError(self.message or "not counted", self.reason or UnknownReason.COUNT)
        return self.work


@dataclass(frozen=True)
class ToCount:
    """One problem's workloads to count (`count_problems`)."""

    definition: Definition
    workloads: tuple[Workload, ...]
    root: Path | None = None  # the problem's folder: its safetensors inputs


@dataclass(frozen=True)
class _Job:
    problem: int  # index into the problems of the request
    workload: Workload


def count_bounded(definition: Definition, workload: Workload, problem_root: Path | None = None, *,
                  runner: CountRunner, limits: CountLimits = CountLimits(), use_formulas: bool = True) -> WorkCount:
    """`count_work` under the limits; a workload it cannot count is a `SolUnknownError`."""
    [counted] = count_workloads(definition, [workload], problem_root, runner=runner, limits=limits,
                                use_formulas=use_formulas)
    return counted.unwrap()


def count_workloads(definition: Definition, workloads: Sequence[Workload], problem_root: Path | None = None, *,
                    runner: CountRunner, limits: CountLimits = CountLimits(),
                    use_formulas: bool = True) -> list[Counted]:
    """Every workload counted in one child, in order; after a child dies or is killed, the
    workload it was on is unknown and a new child counts the rest."""
    [counted] = count_problems([ToCount(definition, tuple(workloads), problem_root)], runner=runner, limits=limits,
                               use_formulas=use_formulas)
    return counted


def count_problems(problems: Sequence[ToCount], *, runner: CountRunner, limits: CountLimits = CountLimits(),
                   use_formulas: bool = True) -> list[list[Counted]]:
    """The workloads of several problems counted in one child (one torch import for all: `up`'s
    size check), per problem in order; a child that dies loses only the workload it was on."""
    jobs = [_Job(index, w) for index, problem in enumerate(problems) for w in problem.workloads]
    results: list[Counted] = []
    while len(results) < len(jobs):
        results.extend(_run_child(problems, jobs[len(results):], runner, limits, use_formulas))
    grouped: list[list[Counted]] = [[] for _ in problems]
    for job, counted in zip(jobs, results, strict=True):
        grouped[job.problem].append(counted)
    return grouped


def _request(problems: Sequence[ToCount], jobs: list[_Job], limits: CountLimits, use_formulas: bool) -> dict[str, Any]:
    return {
        "definitions": [json.loads(p.definition.model_dump_json(exclude_unset=True)) for p in problems],
        "roots": [str(Path(p.root).resolve()) if p.root is not None else None for p in problems],
        "jobs": [{"problem": j.problem, "workload": json.loads(j.workload.model_dump_json(exclude_unset=True))}
                 for j in jobs],
        "use_formulas": use_formulas, "time_s": limits.time_s, "cpu_budget_bytes": limits.cpu_budget_bytes,
        "memory_mb": limits.memory_mb,
    }


def _run_child(problems: Sequence[ToCount], jobs: list[_Job], runner: CountRunner, limits: CountLimits,
               use_formulas: bool) -> list[Counted]:
    """Counts as many of `jobs` as one child manages: each reported one, then the one it was on
    when it died or was killed (all of them when it never started)."""
    roots = sorted({Path(p.root).resolve() for p in problems if p.root is not None})
    child = runner.start(_request(problems, jobs, limits, use_formulas), roots, limits.memory_mb)
    results: list[Counted] = []
    started, end = False, _End.LATE  # an exception while reading: killed at once
    try:
        results, started, end = _read_results(child, jobs, limits)
    finally:  # every result in, or killed: no need to wait for its end; else its own exit code
        code = child.stop(limits.grace_s if end is _End.EXITED else 0.0)
    if end is _End.DONE:
        return results
    current = jobs[len(results)].workload
    if end is _End.LATE:
        return [*results, Counted(current.uuid, None, UnknownReason.TIME,
                                  f"counting ran past the time limit of {limits.time_s:g} s (sol_count_time_s)")]
    if end is _End.GARBLED:
        return [*results, Counted(current.uuid, None, UnknownReason.CRASH,
                                  "the counting process wrote a line that is not a result")]
    reason, message = _death(code, limits, child.log_tail()[-STDERR_TAIL:].strip())
    if not started:  # the child never counted anything: every workload has the same fate
        return [Counted(j.workload.uuid, None, reason, f"the counting process did not start: {message}") for j in jobs]
    return [*results, Counted(current.uuid, None, reason, message)]


class _End(Enum):
    """How reading a child's results ended."""

    DONE = "done"  # every result in
    EXITED = "exited"  # it ended (or closed its channel) before that
    LATE = "late"  # a workload made no progress for the time limit plus the grace
    GARBLED = "garbled"  # it wrote a line that is not a result (the reference writes where it should not)


def _read_results(child: CountChild, jobs: list[_Job], limits: CountLimits) -> tuple[list[Counted], bool, _End]:
    """Lines from the child until it has sent every result, ends, or a workload makes no progress
    for the time limit plus the grace: (results, whether it said it was ready, how it ended). Its
    end is seen by its exit, not only by the channel's end: a process it left behind may hold the
    channel open."""
    results: list[Counted] = []
    started = False
    buffer = b""
    deadline = time.monotonic() + limits.time_s + limits.grace_s + 60.0  # the first: torch's import too
    with selectors.DefaultSelector() as selector:
        selector.register(child.results_fd, selectors.EVENT_READ)
        while len(results) < len(jobs):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return results, started, _End.LATE
            ended = child.exit_code() is not None  # what it wrote before it ended is still read below
            if not selector.select(timeout=0.0 if ended else min(remaining, 0.5)):
                if ended:
                    return results, started, _End.EXITED
                continue
            chunk = os.read(child.results_fd, 1 << 16)
            if not chunk:
                return results, started, _End.EXITED
            buffer += chunk
            while b"\n" in buffer and len(results) < len(jobs):
                line, buffer = buffer.split(b"\n", 1)
                try:
                    message = json.loads(line)
                    counted = None if message.get("ready") else _counted(jobs[len(results)].workload, message)
                except (ValueError, KeyError, TypeError, AttributeError):
                    return results, started, _End.GARBLED
                if counted is None:
                    started = True
                else:
                    results.append(counted)
                deadline = time.monotonic() + limits.time_s + limits.grace_s
    return results, started, _End.DONE


def _counted(workload: Workload, message: dict) -> Counted:
    if "work" in message:
        return Counted(workload.uuid, work_from_json(message["work"]), peak_mb=message.get("peak_mb"))
    return Counted(workload.uuid, None, UnknownReason(message["reason"]), message["error"], message.get("peak_mb"))


def _death(code: int | None, limits: CountLimits, tail: str) -> tuple[UnknownReason, str]:
    """Why a child ended before it reported every workload, from its exit and its stderr."""
    last = tail.splitlines()[-1] if tail else ""
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        if -code in (signal.SIGKILL, signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS):
            return UnknownReason.MEMORY, (f"the counting process died of {name} under its memory limit of "
                                          f"{limits.memory_mb} MiB (sol_count_memory_mb), most likely out of "
                                          f"memory; {last}".rstrip("; "))
        return UnknownReason.CRASH, f"the counting process died of {name}; {last}".rstrip("; ")
    if "MemoryError" in tail or "bad_alloc" in tail or "can't allocate memory" in tail:
        return UnknownReason.MEMORY, (f"the counting process ran out of its memory limit of {limits.memory_mb} "
                                      f"MiB (sol_count_memory_mb): {last}")
    return UnknownReason.CRASH, f"the counting process exited with {code}: {last}"


def work_to_json(work: WorkCount) -> dict[str, Any]:
    return {"matrix_flops": {p.value: n for p, n in work.matrix_flops.items()}, "vector_flops": work.vector_flops,
            "read_bytes": work.read_bytes, "write_bytes": work.write_bytes, "read_elements": work.read_elements,
            "write_elements": work.write_elements, "input_precision": work.input_precision.value,
            "solar_precision": work.solar_precision.value, "counted_on": work.counted_on,
            "unread_inputs": list(work.unread_inputs), "bool_elements": work.bool_elements}


def work_from_json(data: dict[str, Any]) -> WorkCount:
    return WorkCount(MappingProxyType({Precision(p): int(n) for p, n in data["matrix_flops"].items()}),
                     data["vector_flops"], data["read_bytes"], data["write_bytes"], data["read_elements"],
                     data["write_elements"], Precision(data["input_precision"]), Precision(data["solar_precision"]),
                     data["counted_on"], tuple(data["unread_inputs"]), data["bool_elements"])

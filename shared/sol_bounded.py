"""Counting a problem's work in a child process with a memory and a time limit.

`shared.sol_count.count_work` runs the reference: on meta tensors that costs nothing, but a
reference that needs values runs on the CPU with real tensors, and one that materialises a huge
intermediate, or loops, would take the caller's memory or time with it (three quantisation
problems of SOL-ExecBench took 22 GB of a 24 GB machine and ended other processes). Here the
counting runs in `python -m shared.sol_child`, which sets `RLIMIT_AS` on itself before it imports
torch and a soft alarm per workload; this process kills it when a workload makes no progress for
the time limit plus a grace. A workload it cannot count gets a `Counted` without work, with the
reason (`UnknownReason`) and a message, never an exception, and the child is started again for the
workloads after it.

The limits (`CountLimits`) come from the settings `sol_count_memory_mb` and `sol_count_time_s`.
The address-space limit counts virtual memory: the child with torch imported reserves about
0.8 GB before it counts anything (measured on torch 2.13 CPU, docs/sol.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import MappingProxyType
from typing import Any

from shared.hardware import Precision
from shared.schema import Definition, Workload
from shared.sol_count import DEFAULT_CPU_BUDGET_BYTES, SolCountError, WorkCount

DEFAULT_MEMORY_MB = 6144
DEFAULT_TIME_S = 120.0
GRACE_S = 10.0  # past the child's own alarm, before the hard kill
STDERR_TAIL = 2000
# The child runs a problem's reference, which may have come through the submit form: it gets no
# settings, keys or URLs of this process, only what Python and torch need to start.
_PASSED_ENV = frozenset({"PATH", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV", "HOME",
                         "OMP_NUM_THREADS", "MKL_NUM_THREADS"})


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


def count_bounded(definition: Definition, workload: Workload, problem_root: Path | None = None, *,
                  limits: CountLimits = CountLimits(), use_formulas: bool = True) -> WorkCount:
    """`count_work` under the limits; a workload it cannot count is a `SolUnknownError`."""
    [counted] = count_workloads(definition, [workload], problem_root, limits=limits, use_formulas=use_formulas)
    return counted.unwrap()


def count_workloads(definition: Definition, workloads: Sequence[Workload], problem_root: Path | None = None, *,
                    limits: CountLimits = CountLimits(), use_formulas: bool = True) -> list[Counted]:
    """Every workload counted in one child, in order; after a child dies or is killed, the
    workload it was on is unknown and a new child counts the rest."""
    results: list[Counted] = []
    while len(results) < len(workloads):
        rest = list(workloads[len(results):])
        done = _run_child(definition, rest, problem_root, limits, use_formulas)
        results.extend(done)
    return results


def _run_child(definition: Definition, workloads: list[Workload], problem_root: Path | None,
               limits: CountLimits, use_formulas: bool) -> list[Counted]:
    """Counts as many of `workloads` as one child manages: each reported one, then the one it
    was on when it died or was killed (all of them when it never started)."""
    request = json.dumps({
        "definition": json.loads(definition.model_dump_json(exclude_unset=True)),
        "workloads": [json.loads(w.model_dump_json(exclude_unset=True)) for w in workloads],
        "problem_root": str(Path(problem_root).resolve()) if problem_root is not None else None,
        "use_formulas": use_formulas, "time_s": limits.time_s, "cpu_budget_bytes": limits.cpu_budget_bytes,
    })
    env = {k: v for k, v in os.environ.items() if k in _PASSED_ENV} | {"KERNELSWARM_SOL_CHILD_MEMORY_MB": str(limits.memory_mb)}
    with tempfile.TemporaryFile() as stderr:
        child = subprocess.Popen([sys.executable, "-m", "shared.sol_child"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=stderr, env=env, start_new_session=True)
        try:
            child.stdin.write(request.encode())
            child.stdin.close()
        except BrokenPipeError:
            pass
        try:
            results, started, killed = _read_results(child, workloads, limits)
        finally:
            code = _reap(child)
            child.stdout.close()
        if len(results) == len(workloads):
            return results
        stderr.seek(0)
        tail = stderr.read().decode(errors="replace")[-STDERR_TAIL:].strip()
    current = workloads[len(results)]
    if killed:
        results.append(Counted(current.uuid, None, UnknownReason.TIME,
                               f"counting ran past the time limit of {limits.time_s:g} s (sol_count_time_s)"))
        return results
    reason, message = _death(code, limits, tail)
    if not started:  # the child never counted anything: every workload has the same fate
        return [Counted(w.uuid, None, reason, f"the counting process did not start: {message}") for w in workloads]
    results.append(Counted(current.uuid, None, reason, message))
    return results


def _read_results(child: subprocess.Popen, workloads: list[Workload],
                  limits: CountLimits) -> tuple[list[Counted], bool, bool]:
    """Lines from the child until it ends or a workload makes no progress for the time limit
    plus the grace: (results, whether it said it was ready, whether it was killed)."""
    import selectors

    results: list[Counted] = []
    started = False
    buffer = b""
    deadline = time.monotonic() + limits.time_s + limits.grace_s + 60.0  # the first: torch's import too
    with selectors.DefaultSelector() as selector:
        selector.register(child.stdout, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                _kill(child)
                return results, started, True
            if not selector.select(timeout=min(remaining, 1.0)):
                continue
            chunk = os.read(child.stdout.fileno(), 1 << 16)
            if not chunk:
                return results, started, False
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                message = json.loads(line)
                if message.get("ready"):
                    started = True
                else:
                    results.append(_counted(workloads[len(results)], message))
                deadline = time.monotonic() + limits.time_s + limits.grace_s


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


def _kill(child: subprocess.Popen) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)  # its own session: anything the reference started too
    except ProcessLookupError:
        pass


def _reap(child: subprocess.Popen) -> int | None:
    try:
        return child.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        _kill(child)
        return child.wait()


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

"""Guards the candidate child runs around the solution: what it may not touch, checked after the
solution is imported and after every call. A violation ends the workload as `REWARD_HACK`.

Caught here: replacing the timer or harness functions (time, torch.cuda.Event/synchronize, the
harness's own functions), starting threads or processes that outlive a call, modifying the inputs,
returning a tensor subclass or a lazy stand-in instead of a plain tensor. The parent catches the rest
it can: results that do not match the workloads it sent, outputs it re-checks itself, and (with the
SOL model) a time below the physical limit.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from typing import Any

import torch


def _watched() -> list[tuple[Any, str]]:
    from services.evaluator import child, tensorfile, timing

    watched: list[tuple[Any, str]] = [
        (time, "perf_counter"), (time, "perf_counter_ns"), (time, "monotonic"), (time, "time"),
        (torch, "save"), (torch, "load"), (torch.Tensor, "copy_"), (torch.Tensor, "clone"),
        (torch.cuda, "synchronize"), (torch.cuda, "Event"), (torch.cuda, "current_stream"),
        (torch.cuda.Event, "record"), (torch.cuda.Event, "elapsed_time"), (torch.cuda.Event, "synchronize"),
    ]
    watched += [(tensorfile, "save"), (tensorfile, "load")]
    watched += [(timing, name) for name in ("time_runs", "_time_on_host", "synchronize", "cupti_recorder")]
    watched += [(timing._GpuClock, name) for name in ("__init__", "time", "latency")]
    watched += [(timing.CuptiRecorder, name) for name in ("start", "stop_span_ms", "_buffer_completed")]
    watched += [(torch.cuda, "_sleep"), (torch.Tensor, "fill_")]
    watched += [(child, name) for name in ("_invoke", "_call", "_write_json", "_empty_outputs",
                                           "run_candidate", "_as_outputs")]
    from services.evaluator import guards

    watched += [(guards.Guard, name) for name in ("check", "check_inputs", "check_outputs")]
    return watched


class Guard:
    def __init__(self) -> None:
        self._originals = [(owner, name, getattr(owner, name)) for owner, name in _watched()]
        self._threads = set(threading.enumerate())
        self._processes = _child_processes()

    def check(self) -> str | None:
        """A message naming the first violation, or None."""
        for owner, name, original in self._originals:
            if getattr(owner, name, None) is not original:
                where = getattr(owner, "__name__", type(owner).__name__)
                return f"the solution replaced {where}.{name} (the timer and the harness are off limits)"
        extra_threads = [t.name for t in threading.enumerate() if t not in self._threads and t.is_alive()]
        if extra_threads:
            return f"the solution left threads running: {extra_threads} (no work outside the call)"
        extra_processes = _child_processes() - self._processes
        if extra_processes:
            return f"the solution started processes {sorted(extra_processes)} (no work outside the call)"
        return None

    @staticmethod
    def check_inputs(before: dict[str, Any], after: dict[str, Any]) -> str | None:
        for name, value in before.items():
            if isinstance(value, torch.Tensor) and not _identical(value, after[name]):
                return f"the solution modified its input `{name}` (inputs are read-only)"
        return None

    @staticmethod
    def check_outputs(outputs: dict[str, Any]) -> str | None:
        for name, value in outputs.items():
            if isinstance(value, torch.Tensor) and type(value) is not torch.Tensor:
                return (f"output `{name}` is a {type(value).__name__}, a tensor subclass: return plain "
                        f"torch.Tensor values")
            if not isinstance(value, (torch.Tensor, int, float, bool)) and value is not None:
                return f"output `{name}` is a {type(value).__name__}, not a tensor"
        return None


def snapshot(inputs: dict[str, Any]) -> dict[str, Any]:
    """A private copy of the inputs to compare with after the call (untimed)."""
    return {n: v.detach().clone() if isinstance(v, torch.Tensor) else v for n, v in inputs.items()}


def _identical(a: torch.Tensor, b: Any) -> bool:
    """Bit for bit (so NaNs compare, and FP8/FP4 inputs, which have no arithmetic, work too)."""
    if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(_bytes(a), _bytes(b)))


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def _child_processes() -> set[int]:
    """Live child processes of this process (Linux /proc); empty where /proc is missing."""
    found: set[int] = set()
    try:
        tasks: Iterable[str] = os.listdir(f"/proc/{os.getpid()}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{os.getpid()}/task/{task}/children") as handle:
                found.update(int(pid) for pid in handle.read().split())
        except OSError:
            continue
    return {pid for pid in found if _alive(pid)}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False

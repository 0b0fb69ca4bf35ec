"""Guards the candidate child runs around the solution: what it may not touch, checked after the
solution is imported and after every call. A violation ends the workload as `REWARD_HACK`.

Caught here: replacing the timer or harness functions (time, torch.cuda.Event/synchronize, any name
bound in the harness's own modules or classes, the code of their functions, the builtins, the
standard-library functions the harness relies on, the harness's entries in sys.modules), profile,
trace and gc hooks, exit handlers, signal handlers installed during a call and timers armed or
signals pending after one (`signal_guard`), starting threads or processes that outlive a call
(descendants included: the sandbox makes the candidate their subreaper), modifying the inputs,
returning a tensor subclass or a lazy stand-in instead of a plain tensor. `check_call` is the cheap
part, run inside every timed call, for a timer patched just for the timer's next reading (a few
attribute reads: its floor is taken off the host's samples, and the reference's timed calls make it
too); `check_after_call`, the signal guard's system calls, runs right after each timed call's end
reading, outside its sample. The parent
catches the rest it can: results that do not match the workloads it sent, outputs it re-checks
itself, and (with the SOL model) a time below the physical limit.

All of this runs in the solution's own process, so it raises the bar rather than closing the door:
see docs/results/hardening.md for what it does not catch.
"""

from __future__ import annotations

import atexit
import builtins
import gc
import json
import math
import os
import pathlib
import resource
import signal
import statistics
import sys
import threading
import time
from collections.abc import Iterable
from types import FunctionType, ModuleType
from typing import Any

import torch

from services.evaluator.harness import timing
from services.evaluator.harness.signal_guard import SignalWatch


HARNESS = tuple(f"services.evaluator.{name}" for name in (
    "harness.main", "harness.candidate", "harness.phases", "harness.clock", "harness.timing", "harness.guards",
    "harness.gpu_handover", "harness.tensorfile", "harness.inputs", "harness.entry", "harness.signal_guard",
    "languages.launch"))
KEPT_MODULES = (*HARNESS, "time", "statistics", "json", "math", "os", "gc", "threading", "torch", "builtins",
                "safetensors", "safetensors.torch", "pathlib", "signal")
_MISSING = object()


def _watched() -> list[tuple[Any, str]]:
    from services.evaluator.harness import entry, phases, tensorfile
    from services.evaluator.languages import launch

    candidate = sys.modules.get("services.evaluator.harness.candidate")  # the role that makes a guard

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
    watched += [(torch.cuda, "_sleep"), (torch.Tensor, "fill_"), (torch.Tensor, "max")]  # the flush
    if timing.cuda_bindings() is not None:  # what resets persisting L2 lines and shares the output sets
        driver, runtime = timing.cuda_bindings()
        watched += [(runtime, name) for name in ("cudaCtxResetPersistingL2Cache", "cudaError_t",
                                                 "cudaIpcGetMemHandle", "cudaIpcMemHandle_t")]
        watched += [(driver, "cuMemGetAddressRange")]
    if candidate is not None:  # found by name: the candidate imports this module, not the other way round
        watched += [(candidate, name) for name in ("_invoke", "_call", "run_candidate", "cubin_kernels",
                                                   "foreign_kernels")]
    watched += [(phases, "write_json")]
    watched += [(entry, name) for name in ("empty_outputs", "empty_holding", "hold", "as_outputs", "cubin_kernels")]
    watched += [(launch, "foreign_kernels"), (launch.Kernels, "defines")]  # a `cuda` solution's kernels its own
    watched += [(Guard, name) for name in ("check", "check_inputs", "check_outputs", "check_call", "after_import",
                                           "check_after_call", "check_signals")]
    # What the signal guard reads the process's signal state with (`signal_guard`).
    watched += [(signal, name) for name in ("getitimer", "getsignal", "sigpending", "valid_signals", "Signals")]
    watched += [(os, name) for name in ("pread", "fstat")] + [(resource, "getrlimit")]
    # What the harness calls between the solution's calls and the result file, input sets made
    # again from their seeds and their digests included.
    watched += [(torch, name) for name in ("equal", "isfinite", "full", "zeros", "empty", "randn", "randint",
                                           "Generator", "arange", "stack")]
    watched += [(torch.Tensor, name) for name in ("detach", "contiguous", "reshape", "view", "numel", "data_ptr",
                                                  "untyped_storage", "to", "__class__", "element_size", "narrow",
                                                  "numpy", "sum", "tolist", "bool")]
    watched += [(statistics, "median"), (json, "dumps"), (json, "loads"), (math, "isfinite"), (os, "replace"),
                (os, "_exit"), (os, "listdir"), (threading, "enumerate"), (threading, "active_count")]
    watched += [(pathlib.Path, name) for name in ("write_text", "read_text", "replace", "with_suffix", "exists")]
    watched += [(builtins, name) for name, value in vars(builtins).items() if callable(value)]
    for module in _harness_modules():  # every name bound in the harness, and in its classes
        watched += [(module, name) for name in vars(module)]
        for value in list(vars(module).values()):
            if isinstance(value, type) and value.__module__ == module.__name__:
                watched += [(value, name) for name in vars(value)]
    return watched


def _harness_modules() -> list[ModuleType]:
    return [sys.modules[name] for name in HARNESS if name in sys.modules]


def _functions(values: Iterable[Any]) -> list[FunctionType]:
    """The plain Python functions among `values` (those in static and class methods too)."""
    found = []
    for value in values:
        value = getattr(value, "__func__", value)
        if isinstance(value, FunctionType):
            found.append(value)
    return found


def _hooks() -> tuple[Any, ...]:
    return (sys.gettrace(), sys.getprofile(), threading.gettrace(), threading.getprofile(), *gc.callbacks)


class Guard:
    def __init__(self) -> None:
        self._originals = [(owner, name, vars(owner).get(name, _MISSING)) for owner, name in _watched()]
        self._codes = [(f, f.__code__, f.__defaults__, f.__kwdefaults__)
                       for f in _functions(original for _, _, original in self._originals)]
        self._modules = {name: sys.modules.get(name) for name in KEPT_MODULES}
        self._hooks = _hooks()
        self._exit_handlers = atexit._ncallbacks()
        self._clock, self._profile, self._trace = time.perf_counter, sys.getprofile(), sys.gettrace()
        self._threads = set(threading.enumerate())
        self._thread_count = threading.active_count()
        self._processes = _child_processes()
        # The binding's list's contents (the guard watches its name only): what the timer resets L2
        # with and the harness shares output sets with.
        self._cuda = list(timing._CUDA)
        self._signals = SignalWatch()  # handlers, timers and pending signals (`signal_guard`)

    def after_import(self) -> str | None:
        """Once the solution is imported: no timer armed, no signal pending, no handler of its own for
        a timer's signal; the other handlers it installed (honest libraries install some) are the base
        that later calls are compared with."""
        return self._signals.after_import()

    def check_signals(self) -> str | None:
        """After the timed batch, before its `end`: no handler installed, timer armed or signal
        pending, which would run work after the timer's last reading (`signal_guard`)."""
        return self._signals.check()

    def check(self) -> str | None:
        """A message naming the first violation, or None."""
        for owner, name, original in self._originals:
            if vars(owner).get(name, _MISSING) is not original:
                where = getattr(owner, "__name__", type(owner).__name__)
                return f"the solution replaced {where}.{name} (the timer and the harness are off limits)"
        for function, code, defaults, kwdefaults in self._codes:
            if (function.__code__ is not code or function.__defaults__ is not defaults
                    or function.__kwdefaults__ is not kwdefaults):
                return (f"the solution replaced the code of {function.__module__}.{function.__qualname__} "
                        f"(the timer and the harness are off limits)")
        for name, module in self._modules.items():
            if sys.modules.get(name) is not module:
                return f"the solution replaced sys.modules[{name!r}] (the timer and the harness are off limits)"
        if _hooks() != self._hooks:
            return "the solution set a profile, trace or gc hook (the interpreter is off limits)"
        if atexit._ncallbacks() != self._exit_handlers:
            return "the solution registered an exit handler (no work outside the call)"
        extra_threads = [t.name for t in threading.enumerate() if t not in self._threads and t.is_alive()]
        if extra_threads:
            return f"the solution left threads running: {extra_threads} (no work outside the call)"
        extra_processes = _child_processes() - self._processes
        if extra_processes:
            return f"the solution started processes {sorted(extra_processes)} (no work outside the call)"
        return self._runtime_kept() or self._signals.check()

    def check_call(self) -> str | None:
        """The cheap part, run inside every timed call just after the solution returns: a timer
        patched, or a hook set, for the timer's next reading only; a thread still at work. No
        system call: about 0.5 us on the 2-core CPU VM (2026-12-07)."""
        if time.perf_counter is not self._clock or sys.getprofile() is not self._profile \
                or sys.gettrace() is not self._trace:
            return ("the solution replaced the timer, or set a profile or trace hook, during a timed call "
                    "(the timer is off limits)")
        if threading.active_count() != self._thread_count:
            return "the solution left threads running after a timed call (no work outside the call)"
        return self._runtime_kept()

    def check_after_call(self) -> str | None:
        """Right after each timed call's end reading: a timer armed or a signal pending, which would
        run work after it (`SignalWatch.check_call`). Its system calls cost 6 us to over 100 us
        inside a call on the 2-core CPU VM (more after torch's parallel kernels, whose threads still
        spin), so it runs outside the sample; a timer would have to fire in the microsecond between
        the end reading and this check to be missed, and one armed for later is found armed here."""
        return self._signals.check_call()

    def _runtime_kept(self) -> str | None:
        if len(timing._CUDA) != len(self._cuda) or any(a is not b for a, b in zip(timing._CUDA, self._cuda)):
            return ("the solution replaced the CUDA bindings the timer resets L2 with and the harness shares "
                    "outputs with (the timer and the harness are off limits)")
        return None

    @staticmethod
    def check_inputs(before: dict[str, Any], after: dict[str, Any]) -> str | None:
        for name, value in before.items():
            if isinstance(value, _Masked) and not _identical(value, after[name]):
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


GUARD_FLOOR_CALLS = 200


def guard_floor_ms(check_call) -> float:
    """The fastest of `GUARD_FLOOR_CALLS` calls of a guard's `check_call`, less the fastest empty
    bracket of the same clock: the least the check costs inside a timed host run, taken off each
    host sample (`timing.time_runs`). Taken before the solution loads, so that the solution cannot
    make it read more (what the check reads only grows after the import: timers, threads). The
    reference's timed runs make the same check and have the same floor taken off
    (`reference_role._time_as_candidate`), so that what is left beyond it counts on both sides."""
    clock = time.perf_counter
    checks, empty = [], []
    for _ in range(GUARD_FLOOR_CALLS):
        began = clock()
        check_call()
        checks.append(clock() - began)
        began = clock()
        empty.append(clock() - began)
    return max(min(checks) - min(empty), 0.0) * 1e3


def snapshot(inputs: dict[str, Any]) -> dict[str, Any]:
    """A private copy of the inputs to compare with after the call (untimed). Kept XOR-masked with
    random bytes: a solution that scans its process for tensors equal to an input (to change them
    all consistently) does not find this copy."""
    return {n: _Masked(v) if isinstance(v, torch.Tensor) else v for n, v in inputs.items()}


class _Masked:
    def __init__(self, tensor: torch.Tensor) -> None:
        raw = _bytes(tensor)
        self.shape, self.dtype = tensor.shape, tensor.dtype
        self.mask = torch.randint(0, 256, raw.shape, dtype=torch.uint8, device=raw.device,
                                  generator=_generator(raw.device))
        self.masked = raw ^ self.mask


def _generator(device: torch.device) -> torch.Generator:
    """The masks' own random numbers, apart from the global generator the solution may use."""
    if device not in _GENERATORS:
        _GENERATORS[device] = torch.Generator(device).manual_seed(int.from_bytes(os.urandom(6), "little"))
    return _GENERATORS[device]


_GENERATORS: dict[torch.device, torch.Generator] = {}


def _identical(a: _Masked, b: Any) -> bool:
    """Bit for bit (so NaNs compare, and FP8/FP4 inputs, which have no arithmetic, work too)."""
    if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(_bytes(b) ^ a.mask, a.masked))


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def _child_processes() -> set[int]:
    """Live child processes of this process (Linux /proc); empty where /proc is missing. By
    /proc/self, not its pid: in a PID namespace of its own whose /proc could not be made afresh,
    /proc's pids are the host's (its children's too, so they stay consistent)."""
    found: set[int] = set()
    try:
        tasks: Iterable[str] = os.listdir("/proc/self/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/children") as handle:
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

"""Timing: warm-up, then many timed runs; the median is the latency.

On a CUDA device, before every run: a device-wide synchronize, the L2 cache flushed (a buffer of
twice its size overwritten, then read back, so that the lines left behind are clean), then a short
spin kernel sized from the run's own host launch time, so that the run is fully queued before the
GPU reaches the start event (the host's launch cost stays out of the timed region, as when a GPU is
kept busy). The run is bracketed by events on the current
stream and, where CUPTI is present (`cupti-python`), its kernels, copies and memsets are recorded
on every stream: the latency of a run is then the CUPTI span (first start to last end, the device's
own clock), so work moved to another stream counts; the events' median is kept beside it, and is
the latency where CUPTI is absent. At least 50 runs are timed there. On the CPU, `perf_counter`.
A time budget caps slow workloads (never fewer than 3 runs), and `plan.max_runs` caps every
workload: the candidate has that many timed input sets, one per timed run.
An optional `prepare(i)` runs before every iteration, outside the timed region (fresh inputs
and outputs for the candidate). Warm-up runs get `i < 0`, timed runs `i = 0, 1, ...`. An optional
`begin()` runs once between the warm-up and the first timed run: where the evaluator's outer clock
is on, the child asks for its timed batch there (`outer_clock`), and the timed sets arrive then;
where it returns a number, at most that many runs are timed (one per timed set it made).
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

MIN_RUNS = 3
MIN_GPU_RUNS = 50


@dataclass(frozen=True)
class TimingPlan:
    warmup_runs: int
    timing_runs: int
    budget_s: float
    max_runs: int | None = None  # at most this many timed runs, whatever the device's minimum

    def wanted_runs(self, device: torch.device) -> int:
        """How many timed runs the plan asks for on `device` before its budget or `max_runs` cut it."""
        runs = max(self.timing_runs, MIN_GPU_RUNS) if device.type == "cuda" else self.timing_runs
        return runs if self.max_runs is None else min(runs, self.max_runs)


@dataclass(frozen=True)
class Latency:
    median_ms: float
    min_ms: float
    max_ms: float
    runs: int
    clock: str = "perf_counter"  # "cupti" (device-wide), "events" (current stream) or "perf_counter"
    event_median_ms: float | None = None  # the events' own median, for comparison with CUPTI's
    total_ms: float | None = None  # the sum of the timed runs' samples (for the outer clock, not the trace)
    l2_persisting_reset: bool | None = None  # on a GPU: persisting L2 lines reset before every flush
    kernels: tuple[str, ...] = ()  # on a GPU with CUPTI: the names of the kernels the timed runs ran (not the trace)
    q1_ms: float | None = None  # the runs' quartiles: the interval a latency is shown with
    q3_ms: float | None = None

    @classmethod
    def of(cls, samples: list[float], **more: Any) -> Latency:
        """Median, extremes, quartiles and count of the timed runs' samples."""
        q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive") if len(samples) > 1 else samples * 3
        return cls(statistics.median(samples), min(samples), max(samples), len(samples), q1_ms=q1, q3_ms=q3, **more)

    def as_dict(self) -> dict[str, Any]:
        return {"median_ms": self.median_ms, "min_ms": self.min_ms, "max_ms": self.max_ms, "runs": self.runs,
                "q1_ms": self.q1_ms, "q3_ms": self.q3_ms, "clock": self.clock, "event_median_ms": self.event_median_ms,
                "l2_persisting_reset": self.l2_persisting_reset}


def sm_clock_mhz(device: torch.device) -> int | None:
    """The SM clock now (through NVML), recorded before and after timing; None where unreadable."""
    if device.type != "cuda":
        return None
    try:
        return int(torch.cuda.clock_rate(device))
    except Exception:  # no NVML on this machine: the trace says the clock is unknown
        return None


# L2 lines marked persisting (by an access policy window on a stream, a launch or a graph node,
# within the L2 set aside for them: `cudaLimitPersistingL2CacheSize`, 11.25 MiB by default on the
# H200 of 2026-12-03) survive the flush before each run: a solution that marked the memory the
# harness writes before a run could find it in L2 when the run starts. So before every timed run's
# flush every persisting line is made normal again (`cudaCtxResetPersistingL2Cache`), and the flush
# evicts it. Marking lines persisting within a call stays allowed: it is a real optimisation, and
# setting the limit once at start is its documented use. Needs cuda-python, bound once per process
# (`bind_runtime`; `gpu_handover` shares output sets through the same binding); without it the
# reset is skipped and the trace says so.
_CUDA: list[Any] = []  # filled in place, never rebound: [(driver, runtime) of cuda-python, or None]


def bind_runtime(device: torch.device) -> None:
    """cuda-python's driver and runtime on `device`, once per process (before a candidate's solution loads)."""
    if _CUDA or device.type != "cuda":
        return
    try:
        from cuda.bindings import driver, runtime

        runtime.cudaSetDevice(device.index or 0)
    except Exception:  # no cuda-python here: persisting lines cannot be reset, output sets go through files
        _CUDA.append(None)
        return
    _CUDA.append((driver, runtime))


def cuda_bindings() -> tuple[Any, Any] | None:
    """(driver, runtime) as bound by `bind_runtime`; None where unbound or missing."""
    return _CUDA[0] if _CUDA else None


def reset_persisting_l2() -> bool:
    """Every persisting L2 line of this process's context back to normal; False where not done."""
    bindings = cuda_bindings()
    if bindings is None:
        return False
    runtime = bindings[1]
    try:
        (error,) = runtime.cudaCtxResetPersistingL2Cache()
    except Exception:  # an API this cuda-python does not have
        return False
    return error == runtime.cudaError_t.cudaSuccess


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_runs(run: Callable[[int], object], device: torch.device, plan: TimingPlan,
              prepare: Callable[[int], object] | None = None, begin: Callable[[], object] | None = None,
              host_overhead_ms: float = 0.0, after: Callable[[int], object] | None = None) -> Latency:
    """Time `run(i)` (i = timed run number, negative for the warm-up runs, so that callers can
    give every run its own input set); `prepare(i)`, if given, runs untimed just before `run(i)`;
    `begin()`, if given, once after the warm-up (a number it returns caps the timed runs). On the
    host, `host_overhead_ms` is taken off every sample: the least the harness's own work inside
    `run` costs (the guard's cheap check, made on both sides), measured before the solution or the
    reference loaded (`guards.guard_floor_ms`). `after(i)`, if given, runs right after each run's
    end reading (the candidate's signal guard, `Guard.check_after_call`)."""
    launches: list[float] = []
    for i in range(-plan.warmup_runs, 0):
        if prepare is not None:
            prepare(i)
        synchronize(device)
        began = time.perf_counter()
        run(i)
        launches.append(time.perf_counter() - began)
        if after is not None:
            after(i)
        synchronize(device)
    # The host's launch time of one run, the first (lazy initialisation) left out.
    launch_s = statistics.median(launches[1:] or launches) if launches else 0.0
    if begin is not None:
        cap = begin()
        if isinstance(cap, int):  # the timed sets it made: at most one timed run each
            plan = dataclasses.replace(plan, max_runs=min(cap, plan.max_runs) if plan.max_runs else cap)
    if device.type != "cuda":
        return _time_on_host(run, plan, prepare, host_overhead_ms, after)
    gpu = _GpuClock(device, launch_s)
    started = time.perf_counter()
    for i in range(plan.wanted_runs(device)):
        if prepare is not None:
            prepare(i)
        gpu.time(run, i, after)
        if len(gpu.samples) >= MIN_RUNS and time.perf_counter() - started > plan.budget_s:
            break
    return gpu.latency()


HOST_FLOOR_CALLS = 2000


@functools.cache
def host_clock_floor_ms() -> float:
    """The shortest time the host's clock reads around a run that does nothing, bracketed by
    `_time_on_host` itself: the fastest of `HOST_FLOOR_CALLS` runs (about 0.2 ms in all), once per
    process. No honest run can read less (`score.below_the_host_clock`). Taken in the process that
    judges, never in a candidate's; 0.0 where the clock is too coarse to see the call."""
    return _time_on_host(lambda i: None, TimingPlan(0, HOST_FLOOR_CALLS, float("inf")), None).min_ms


def _time_on_host(run: Callable[[int], object], plan: TimingPlan,
                  prepare: Callable[[int], object] | None, less_ms: float = 0.0,
                  after: Callable[[int], object] | None = None) -> Latency:
    samples: list[float] = []
    started = time.perf_counter()
    for i in range(plan.wanted_runs(torch.device("cpu"))):
        if prepare is not None:
            prepare(i)
        begin = time.perf_counter()
        run(i)
        samples.append(max((time.perf_counter() - begin) * 1e3 - less_ms, 0.0))
        if after is not None:
            after(i)
        if len(samples) >= MIN_RUNS and time.perf_counter() - started > plan.budget_s:
            break
    return Latency.of(samples, total_ms=sum(samples))


class _GpuClock:
    """One CUDA run at a time: flush, spin, events (and CUPTI) around the run."""

    def __init__(self, device: torch.device, launch_s: float) -> None:
        self.device = device
        l2_bytes = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20)
        self.scratch = torch.empty(max(2 * l2_bytes, 1 << 20) // 4, dtype=torch.int32, device=device)
        # Spin for 1.5x a warm-up launch plus 20 us, counted at 2 GHz (a slower clock only spins
        # longer); at most 10 ms.
        self.spin_cycles = int(min(1.5 * launch_s + 20e-6, 10e-3) * SPIN_HZ)
        self.cupti = cupti_recorder()
        bind_runtime(device)
        self.own_launches = self.count_own_launches() if self.cupti is not None else 0
        self.l2_reset = True  # every run's persisting lines were reset before its flush
        self.kernels: set[str] = set()  # what the runs launched, by CUPTI's names
        self.samples: list[float] = []
        self.event_samples: list[float] = []
        self.cupti_samples: list[float] = []

    def time(self, run: Callable[[int], object], i: int, after: Callable[[int], object] | None = None) -> None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        synchronize(self.device)
        self.l2_reset = reset_persisting_l2() and self.l2_reset  # host call, before the window: no launch
        if self.cupti is not None:
            self.cupti.start()  # records from here: the flush, the spin (left out below), then the run
        self.flush()
        torch.cuda._sleep(self.spin_cycles)
        start.record()
        run(i)
        end.record()
        if after is not None:  # host work once the end is queued: outside the events and CUPTI's span
            after(i)
        synchronize(self.device)
        event_ms = start.elapsed_time(end)
        cupti_ms = self.cupti.stop_span_ms(skip=self.own_launches) if self.cupti is not None else None
        if self.cupti is not None:
            self.kernels.update(self.cupti.kernels)
        self.event_samples.append(event_ms)
        if cupti_ms is not None:
            self.cupti_samples.append(cupti_ms)
        # CUPTI's span is the device's own account of the run on every stream; the events, on the
        # current stream only, are the fallback where CUPTI is absent or recorded nothing.
        self.samples.append(cupti_ms if cupti_ms is not None else event_ms)

    def flush(self) -> None:
        """Evict the L2: twice its size written, then read back. The read writes the flush's dirty
        lines back to memory and leaves clean ones, so that a run neither finds its data cached nor
        pays for the flush's write-backs (Nsight Compute invalidates the caches instead). On the H200
        (docs/results/2026-12-04-l2-flush-probe-h200.txt) a 64 MiB float32 add took 48.9 us after a
        flush that only wrote and 43.6 us after this one; ncu read 44.7 us."""
        self.scratch.fill_(0x5A5A5A5A)
        self.scratch.max()

    def count_own_launches(self) -> int:
        """The CUPTI records the flush and the spin leave first in every window (the read-back's
        count depends on torch's build), counted on windows holding nothing else until two agree."""
        counts: list[int] = []
        for _ in range(OWN_COUNT_TRIES):
            synchronize(self.device)
            self.cupti.start()
            self.flush()
            torch.cuda._sleep(1)
            synchronize(self.device)
            self.cupti.stop_span_ms()
            counts.append(self.cupti.records)
            if len(counts) > 1 and counts[-1] == counts[-2]:
                return counts[-1]
        raise RuntimeError(f"the timer's own launches do not settle: {counts} records in windows with nothing else")

    def latency(self) -> Latency:
        clock = "cupti" if self.cupti_samples and len(self.cupti_samples) == len(self.samples) else "events"
        s = self.samples
        return Latency.of(s, clock=clock, event_median_ms=statistics.median(self.event_samples), total_ms=sum(s),
                          l2_persisting_reset=self.l2_reset, kernels=tuple(sorted(self.kernels)))


SPIN_HZ = 2.0e9
OWN_COUNT_TRIES = 5  # bare windows, at most, for the timer's own records to settle


class CuptiRecorder:
    """Kernels, copies and memsets on every stream of this process, recorded through CUPTI's activity
    API between `start()` and `stop_span_ms()`. CUPTI also reports work launched before `start()`
    that is still running, so a window starts on an idle device (after a synchronize); the first
    `skip` launches of the window (by correlation id: launch order) are the timer's own."""

    def __init__(self, cupti: Any) -> None:
        self._cupti = cupti
        self._kinds = [cupti.ActivityKind.CONCURRENT_KERNEL, cupti.ActivityKind.MEMCPY, cupti.ActivityKind.MEMSET]
        self._spans: list[tuple[int, int, int]] = []
        self._names: dict[int, str] = {}  # correlation id -> name, for kernels
        self.kernels: tuple[str, ...] = ()  # the names of the kernels of the last window, less the first `skip`
        self.records = 0  # how many records the last window held, the first `skip` included
        cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)

    @staticmethod
    def _buffer_requested() -> tuple[int, int]:
        return 4 << 20, 0

    def _buffer_completed(self, activities: list) -> None:
        for a in activities:
            if a.kind in self._kinds:
                self._spans.append((a.correlation_id, a.start, a.end))
                if a.kind == self._kinds[0]:  # a kernel: its name too (cupti-python's `name` is a str)
                    self._names[a.correlation_id] = str(getattr(a, "name", None) or "(unnamed kernel)")

    def start(self) -> None:
        self._cupti.activity_flush_all(1)
        self._spans, self._names = [], {}
        for kind in self._kinds:
            self._cupti.activity_enable(kind)

    def stop_span_ms(self, skip: int = 0) -> float | None:
        """After a synchronize: first start to last end of the window's records, less the first `skip`."""
        for kind in self._kinds:
            self._cupti.activity_disable(kind)
        self._cupti.activity_flush_all(1)
        self.records = len(self._spans)
        spans, self._spans = sorted(self._spans)[skip:], []
        names, self._names = self._names, {}
        self.kernels = tuple(sorted({names[c] for c, _, _ in spans if c in names}))
        if not spans:
            return None
        return (max(e for _, _, e in spans) - min(s for _, s, _ in spans)) / 1e6


_RECORDER: list[CuptiRecorder | None] = []


def cupti_recorder() -> CuptiRecorder | None:
    """The process's recorder (CUPTI takes one set of callbacks per process); None without CUPTI."""
    if not _RECORDER:
        try:
            from cupti import cupti
            _RECORDER.append(CuptiRecorder(cupti))
        except Exception:  # not installed, or no libcupti for this driver: events alone
            _RECORDER.append(None)
    return _RECORDER[0]

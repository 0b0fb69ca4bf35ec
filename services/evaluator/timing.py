"""Timing: warm-up, then many timed runs; the median is the latency.

On a CUDA device the L2 cache is flushed (a buffer of twice its size is overwritten) before every
run, which is then bracketed by events on the current stream after a device-wide synchronize and
followed by another; at least 50 runs are timed there. On the CPU, `perf_counter`. A time budget
caps slow workloads (never fewer than 3 runs).
An optional `prepare(i)` runs before every iteration, outside the timed region (fresh inputs
and outputs for the candidate).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

MIN_RUNS = 3
MIN_GPU_RUNS = 50


@dataclass(frozen=True)
class TimingPlan:
    warmup_runs: int
    timing_runs: int
    budget_s: float


@dataclass(frozen=True)
class Latency:
    median_ms: float
    min_ms: float
    max_ms: float
    runs: int

    def as_dict(self) -> dict[str, float]:
        return {"median_ms": self.median_ms, "min_ms": self.min_ms, "max_ms": self.max_ms, "runs": self.runs}


def sm_clock_mhz(device: torch.device) -> int | None:
    """The SM clock now (through NVML), recorded before and after timing; None where unreadable."""
    if device.type != "cuda":
        return None
    try:
        return int(torch.cuda.clock_rate(device))
    except Exception:  # no NVML on this machine: the trace says the clock is unknown
        return None


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_runs(run: Callable[[int], object], device: torch.device, plan: TimingPlan,
              prepare: Callable[[int], object] | None = None) -> Latency:
    """Time `run(i)` (i = iteration number, so callers can rotate input sets); `prepare(i)`, if
    given, runs untimed just before `run(i)`."""
    for i in range(plan.warmup_runs):
        if prepare is not None:
            prepare(i)
        run(i)
    synchronize(device)
    flush = _l2_flusher(device)
    runs = max(plan.timing_runs, MIN_GPU_RUNS) if device.type == "cuda" else plan.timing_runs
    samples: list[float] = []
    started = time.perf_counter()
    for i in range(runs):
        if prepare is not None:
            prepare(i)
        samples.append(_time_one(run, i, device, flush))
        if len(samples) >= MIN_RUNS and time.perf_counter() - started > plan.budget_s:
            break
    return Latency(statistics.median(samples), min(samples), max(samples), len(samples))


def _l2_flusher(device: torch.device) -> Callable[[], None] | None:
    if device.type != "cuda":
        return None
    l2_bytes = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20)
    scratch = torch.empty(max(2 * l2_bytes, 1 << 20) // 4, dtype=torch.int32, device=device)
    return lambda: scratch.fill_(0x5A5A5A5A)


def _time_one(run: Callable[[int], object], i: int, device: torch.device,
              flush: Callable[[], None] | None) -> float:
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        synchronize(device)
        if flush is not None:
            flush()  # queued ahead of the start event: the run's launch overlaps it, not the timed region
        start.record()
        run(i)
        end.record()
        synchronize(device)
        return start.elapsed_time(end)
    begin = time.perf_counter()
    run(i)
    return (time.perf_counter() - begin) * 1e3

"""Timing: warm-up, then many timed runs; the median is the latency.

On a CUDA device each run is bracketed by events on the current stream after a synchronize;
on the CPU by `perf_counter`. A time budget caps slow workloads (never fewer than 3 runs).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

MIN_RUNS = 3


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


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_runs(run: Callable[[int], object], device: torch.device, plan: TimingPlan) -> Latency:
    """Time `run(i)` (i = iteration number, so callers can rotate input sets)."""
    for i in range(plan.warmup_runs):
        run(i)
    synchronize(device)
    samples: list[float] = []
    started = time.perf_counter()
    for i in range(plan.timing_runs):
        samples.append(_time_one(run, i, device))
        if len(samples) >= MIN_RUNS and time.perf_counter() - started > plan.budget_s:
            break
    return Latency(statistics.median(samples), min(samples), max(samples), len(samples))


def _time_one(run: Callable[[int], object], i: int, device: torch.device) -> float:
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        synchronize(device)
        start.record()
        run(i)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    begin = time.perf_counter()
    run(i)
    return (time.perf_counter() - begin) * 1e3

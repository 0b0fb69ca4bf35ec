"""What both roles of a child share: the seconds spent per phase (reported beside the results,
for diagnostics), the timing plan a job asks for, a traceback cut to size, and the result file
written whole (a crash or a timeout keeps what was done)."""

from __future__ import annotations

import contextlib
import json
import time
import traceback
from pathlib import Path

from services.evaluator.harness.timing import TimingPlan
from services.evaluator.protocol import Job, WorkloadResult

MAX_TRACEBACK_CHARS = 4000

PHASES: dict[str, float] = {}  # seconds spent per phase, reported beside the results (diagnostics)
_ACTIVE: list[list[float]] = []  # [began, seconds in the phases inside it] per phase entered


@contextlib.contextmanager
def phase(name: str):
    """A phase's own seconds: those of the phases entered inside it are theirs."""
    frame = [time.perf_counter(), 0.0]
    _ACTIVE.append(frame)
    try:
        yield
    finally:
        _ACTIVE.pop()
        spent = time.perf_counter() - frame[0]
        PHASES[name] = PHASES.get(name, 0.0) + spent - frame[1]
        if _ACTIVE:
            _ACTIVE[-1][1] += spent


def timing_plan(job: Job) -> TimingPlan:
    return TimingPlan(job.warmup_runs, job.timing_runs, job.timing_budget_s)


def traceback_tail() -> str:
    text = traceback.format_exc()
    return text if len(text) <= MAX_TRACEBACK_CHARS else "...\n" + text[-MAX_TRACEBACK_CHARS:]


def write_results(path: Path, results: list[WorkloadResult]) -> None:
    """The child's `result.json`: every workload's result so far and the phases' seconds."""
    write_json(path, {"workloads": [r.model_dump(exclude_none=True) for r in results],
                      "phases": {k: round(v, 4) for k, v in PHASES.items()}})


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)

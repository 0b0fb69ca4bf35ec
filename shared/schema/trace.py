"""Trace: one solution evaluated on one workload (SOL-ExecBench format plus our additions)."""

from __future__ import annotations

import math
from enum import Enum
from typing import Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from shared.schema.base import Frozen, NonEmptyStr
from shared.schema.workload import Workload


class Status(str, Enum):
    PASSED = "PASSED"
    COMPILE_ERROR = "COMPILE_ERROR"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    TIMEOUT = "TIMEOUT"
    INCORRECT_SHAPE = "INCORRECT_SHAPE"
    INCORRECT_DTYPE = "INCORRECT_DTYPE"
    INCORRECT_NUMERICAL = "INCORRECT_NUMERICAL"
    REWARD_HACK = "REWARD_HACK"
    INVALID_REFERENCE = "INVALID_REFERENCE"
    UNSUPPORTED = "UNSUPPORTED"


class Correctness(Frozen):
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")

    max_relative_error: float = 0.0
    max_absolute_error: float = 0.0
    extra: dict[str, Any] | None = None

    @field_validator("max_relative_error", "max_absolute_error")
    @classmethod
    def _non_negative(cls, value: float) -> float:
        if not math.isnan(value) and value < 0:
            raise ValueError("must be non-negative or NaN")
        return value


class Performance(Frozen):
    latency_ms: float = Field(default=0.0, ge=0.0)
    reference_latency_ms: float = Field(default=0.0, ge=0.0)
    speedup_factor: float = Field(default=0.0, ge=0.0)


class Environment(Frozen):
    hardware: NonEmptyStr
    libs: dict[str, str] = Field(default_factory=dict)


class SolScore(Frozen):
    """Ours: the speed-of-light figures behind a trace's score (filled by the SOL model)."""

    t_sol_ms: float
    t_baseline_ms: float
    score: float
    bound: str
    hardware: str
    # When the evaluator's GPU was calibrated, t_sol_ms is priced at the faster of the datasheet's and
    # the measured ceiling of each unit (so no honest kernel beats it), and these are the same work
    # at each source alone (kept, as the measured ones can drift).
    t_sol_datasheet_ms: float | None = None
    t_sol_measured_ms: float | None = None


class Timing(Frozen):
    """Ours: how the latency was measured (median over `runs`; the SM clock around the runs)."""

    median_ms: float
    min_ms: float
    max_ms: float
    runs: int
    # The timed runs' first and third quartiles, the solution's and the reference's: a latency is
    # shown with its interval, and a speedup only where the two intervals do not overlap (shared.spread).
    q1_ms: float | None = None
    q3_ms: float | None = None
    reference_q1_ms: float | None = None
    reference_q3_ms: float | None = None
    reference_runs: int | None = None  # one per timed set, as the solution's (`runs`)
    sm_clock_mhz_before: int | None = None
    sm_clock_mhz_after: int | None = None
    clock: str | None = None  # "cupti" (every stream), "events" (the current stream) or "perf_counter"
    # On the host: what was taken off every sample, the least the candidate's guard check inside
    # each timed call costs (measured before the solution loaded), so that both sides time only the call.
    guard_ms: float | None = None
    event_median_ms: float | None = None  # the events' median where CUPTI set the latency
    # On a GPU: whether persisting L2 lines were reset before every run's flush (False: cuda-python
    # was missing, so lines a solution marked persisting could have outlived the flush).
    l2_persisting_reset: bool | None = None
    # Where the outer clock was on: the last timed batch's window on the evaluator's own clock, and
    # its allowance (a longer window is timed again: `outer_retimes` batches after the first).
    outer_window_ms: float | None = None
    outer_allowed_ms: float | None = None
    outer_retimes: int | None = None
    # Set where no batch fitted its allowance: the latency charged (the performance's `latency_ms`),
    # the outer clock's figure per run, never below `median_ms` (the solution's own timer's).
    outer_charged_ms: float | None = None
    load_avg: list[float] | None = None  # os.getloadavg() (1, 5, 15 min) at the last batch's end
    # "replay": a `cuda` solution's launch plans timed by a child that ran none of its Python
    # (services/evaluator/timer/); "in_process": timed in the solution's own process, and for a
    # `cuda` solution why it was not replayed.
    mode: str | None = None
    in_process_reason: str | None = None


class Evaluation(Frozen):
    status: Status
    environment: Environment
    timestamp: NonEmptyStr
    log: str = ""
    correctness: Correctness | None = None
    performance: Performance | None = None
    sol: SolScore | None = None
    timing: Timing | None = None

    @model_validator(mode="after")
    def _metrics_match_status(self) -> Evaluation:
        needs_correctness = self.status in (Status.PASSED, Status.INCORRECT_NUMERICAL)
        may_have = needs_correctness or self.status is Status.REWARD_HACK  # a hack can pass the checks
        if needs_correctness and self.correctness is None or not may_have and self.correctness is not None:
            raise ValueError(f"correctness must {'' if needs_correctness else 'not '}be given for {self.status.value}")
        needs_performance = self.status is Status.PASSED
        if needs_performance != (self.performance is not None):
            raise ValueError(f"performance must {'' if needs_performance else 'not '}be given for {self.status.value}")
        return self


class AttemptInfo(Frozen):
    """Ours: who made the attempt and what it cost."""

    campaign: str | None = None
    worker: str | None = None
    model: str | None = None
    parent: str | None = None
    tokens: int = 0
    gpu_seconds: float = 0.0


class Trace(Frozen):
    definition: NonEmptyStr
    workload: Workload
    solution: str | None = None
    evaluation: Evaluation | None = None
    attempt: AttemptInfo | None = None

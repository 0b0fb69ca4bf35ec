"""The outer clock never accuses: a window over its allowance is timed again, and where it stays
over, the workload is charged what the evaluator's own clock vouches for.

For languages whose host code is the kernel (`pytorch`, `triton`, `cute_dsl`, `cuda_cpp`) the
timer runs in the candidate's process; the evaluator's window around each timed batch
(`outer_clock`) bounds what that timer can hide, but the machine's load makes honest windows
longer than any allowance now and then (16 of 68 honest attempts on a loaded CPU were accused
when a window over its allowance was a REWARD_HACK verdict). So, per workload, at the `end` of a
batch whose outputs the checker passed:

- within its allowance (`outer_clock.allowed_ms`): the batch stands (`sealed`);
- over it, up to `EvalConfig.outer_clock_retimes` times: `again`. The checker (the reference's
  process) makes as many fresh input sets as the first batch had, from seeds of its own that the
  candidate has never seen (set numbers after every earlier batch's), and holds their expected
  outputs; the evaluator hands them over as at `go` (seeds, or files moved into the inputs folder)
  and opens a new window. The candidate's harness runs the timed batch again on them (fresh
  copies at new addresses per run, as always), saves the outputs, and says `end`; they are
  checked at once like the first batch's. Every batch's outputs are checked: a solution that
  computes only in one of them fails;
- over it after the last re-time: `sealed`, and the workload passes charged `charged_ms`: the
  window less the reference's calibrated overhead for the sets handed over, per timed run, never
  below the child's own median; the smallest such figure of its batches. The trace says so
  (`evaluation.timing.outer_charged_ms`, `outer_retimes`, `load_avg`).

Whatever time a solution hides from its own timer inside the window is then in what it is charged,
unless its batch fits its allowance (`SLACK_MS` and `K_OVERHEAD` times the overhead: the bound of
docs/results/hardening.md); a solution that plays the harness's part itself and skips its work per
set keeps at most the reference's overhead per set that the charge takes off. REWARD_HACK stays for
positive findings only: a guard's, a forged result (`outer_clock.forged`), a time no clock can read
(`score`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.evaluator.outer_clock import SLACK_MS, Window, allowed_ms, forged, overhead_per_set_ms
from shared.schema import Status

log = logging.getLogger(__name__)

RETIMES = 3  # default of `EvalConfig.outer_clock_retimes`


def charged_ms(window: Window, reference: Window, timed_sets: int) -> float:
    """What the evaluator's clock vouches for per timed run of a batch: its window less the
    reference's overhead per set (calibrated in the reference's own window, not multiplied by
    `K_OVERHEAD`, no slack) for each set handed over, divided by the runs; never below the
    candidate's own median. An honest batch slowed by the machine pays its share of that load;
    a solution that hid time from its timer pays the hidden time."""
    vouched = (window.window_ms - timed_sets * overhead_per_set_ms(reference)) / max(window.runs or 1, 1)
    return max(window.median_ms or 0.0, vouched)


@dataclass(frozen=True)
class ClockAccount:
    """The outer clock's account of one workload the candidate reports as timed."""
    latency_ms: float  # what the workload is charged: the reported median, or `charged_ms` where no batch fit
    window_ms: float  # the last batch's window
    allowed_ms: float  # and its allowance
    retimes: int  # batches after the first
    charged: bool  # no batch fitted its allowance: `latency_ms` is the outer clock's figure
    load_avg: tuple[float, float, float] | None = None  # os.getloadavg() at the last batch's end

    def timing(self) -> dict[str, Any]:
        """The trace's fields (`Timing`)."""
        return {"outer_window_ms": round(self.window_ms, 3), "outer_allowed_ms": round(self.allowed_ms, 3),
                "outer_retimes": self.retimes, "outer_charged_ms": self.latency_ms if self.charged else None,
                "load_avg": list(self.load_avg) if self.load_avg is not None else None}


def account(latency: dict[str, Any], batches: list[Window], reference: Window, timed_sets: int,
            slack_ms: float = SLACK_MS, load_avg: tuple[float, float, float] | None = None,
            last: Window | None = None) -> ClockAccount | str:
    """The account of a workload from its closed batches (in order), or why its result is forged.
    `last`: the workload's last window, where it differs from the last batch (a re-time opened and
    never ended: a result reported without it is forged)."""
    last = last if last is not None else (batches[-1] if batches else None)
    why = forged(latency, last)
    if why:
        return why
    allowed = allowed_ms(last, reference, timed_sets, slack_ms)
    if last.window_ms <= allowed:
        return ClockAccount(last.median_ms or 0.0, last.window_ms, allowed, len(batches) - 1, False, load_avg)
    charged = max(last.median_ms or 0.0, min(charged_ms(b, reference, timed_sets) for b in batches))
    return ClockAccount(charged, last.window_ms, allowed, len(batches) - 1, True, load_avg)


class Retimer:
    """The evaluator's `retime(uuid, window)` for the candidate's outer clock (run in its thread,
    after the batch's seal): None to close the workload's batch, or the `again` payload. `timed`:
    uuid -> (index, the reference's result); `make_sets(index, first, count)` asks the checker for
    fresh sets (`checker.Checker.more`) and returns what `again` carries, or None where it could
    not; `verdict(index)` is the seal's check of the batch just ended."""

    def __init__(self, reference: dict[str, Window], timed: dict[str, tuple[int, dict[str, Any]]], rounds: int,
                 retimes: int, slack_ms: float, make_sets: Callable[[int, int, int], dict[str, Any] | None],
                 verdict: Callable[[int], Any]) -> None:
        self.reference, self.timed, self.rounds = reference, timed, rounds
        self.retimes, self.slack_ms = retimes, slack_ms
        self.make_sets, self.verdict = make_sets, verdict
        self.count: dict[str, int] = {}  # re-times so far per workload
        self.load: dict[str, tuple[float, float, float]] = {}

    def first_set(self, uuid: str) -> int:
        """The set number of the first timed set of the workload's current batch."""
        index, made = self.timed[uuid]
        return self.rounds + self.count.get(uuid, 0) * made["timed_sets"]

    def __call__(self, uuid: str, window: Window) -> dict[str, Any] | None:
        self.load[uuid] = _load_avg()
        index, made = self.timed[uuid]
        check = self.verdict(index)
        if check is None or check.status is not Status.PASSED:
            return None  # its verdict is its outputs'
        reference = self.reference.get(uuid)
        if reference is None or window.window_ms <= allowed_ms(window, reference, made["timed_sets"], self.slack_ms):
            return None
        if self.count.get(uuid, 0) >= self.retimes:
            return None  # charged (`account`)
        first = self.rounds + (self.count.get(uuid, 0) + 1) * made["timed_sets"]
        try:
            payload = self.make_sets(index, first, made["timed_sets"])
        except Exception:  # the evaluator's own failure: the batch it has is charged, never the solution's hack
            log.exception("fresh timed sets for workload %s could not be made", uuid)
            payload = None
        if payload is None:
            return None
        self.count[uuid] = self.count.get(uuid, 0) + 1
        log.info("re-timing workload %s (%d of %d): window %.1f ms, load %s", uuid, self.count[uuid], self.retimes,
                 window.window_ms, self.load[uuid])
        return {"first": first, **payload}


def _load_avg() -> tuple[float, float, float] | None:
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return None
    return round(one, 2), round(five, 2), round(fifteen, 2)

"""Timings with their spread. A latency is its median over the timed runs with the interquartile
interval [q1, q3]; a speedup is said only where the solution's interval and the reference's do not
overlap, and is "≈1x" otherwise: a difference inside the runs' own noise is no result. Where one
solution was evaluated in several attempts on the same hardware, `combine` spreads a latency over
them: the median of their medians and the union of their intervals."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from shared.schema import Trace

SAME = "≈1x"


@dataclass(frozen=True)
class Spread:
    median_ms: float
    q1_ms: float
    q3_ms: float

    def overlaps(self, other: Spread) -> bool:
        return self.q1_ms <= other.q3_ms and other.q1_ms <= self.q3_ms

    def text(self) -> str:
        return f"{self.median_ms:.4g} [{self.q1_ms:.4g}–{self.q3_ms:.4g}]"


def combine(parts: Sequence[Spread]) -> Spread:
    """One latency over several attempts' spreads of it: the median of their medians, and the
    interval from the lowest q1 to the highest q3. The union is the conservative choice: a speedup
    over attempts is said only where every attempt's interval of the solution lies clear of every
    attempt's interval of the reference, so an attempt that ran on a noisier day widens the interval
    rather than being outvoted. Each part's median lies in its interval, so the median of medians lies
    in the union. One part comes back as it is."""
    if not parts:
        raise ValueError("no spreads to combine")
    return Spread(statistics.median(p.median_ms for p in parts), min(p.q1_ms for p in parts),
                  max(p.q3_ms for p in parts))


def spreads(trace: Trace) -> tuple[Spread, Spread] | None:
    """(the solution's, the reference's) for a PASSED trace whose timing has both intervals. The
    solution's is the latency charged: where the outer clock charged more than the solution's own
    median, that figure alone (its runs' quartiles are the solution's claim, not the charge)."""
    evaluation = trace.evaluation
    timing, performance = evaluation.timing, evaluation.performance
    if performance is None or timing is None or None in (timing.q1_ms, timing.q3_ms, timing.reference_q1_ms,
                                                          timing.reference_q3_ms):
        return None
    latency = performance.latency_ms
    if timing.outer_charged_ms is not None or not timing.q1_ms <= timing.median_ms <= timing.q3_ms:
        mine = Spread(latency, latency, latency)
    else:
        mine = Spread(latency, timing.q1_ms, timing.q3_ms)
    reference = performance.reference_latency_ms
    if not timing.reference_q1_ms <= reference <= timing.reference_q3_ms:
        return None  # an interval that does not hold its own median was not measured with it
    return mine, Spread(reference, timing.reference_q1_ms, timing.reference_q3_ms)


def speedup_text(trace: Trace) -> str:
    """"2.31x", or SAME where the intervals overlap; the plain figure where no interval is known."""
    performance = trace.evaluation.performance
    if performance is None:
        return "—"
    pair = spreads(trace)
    if pair is not None and pair[0].overlaps(pair[1]):
        return SAME
    return f"{performance.speedup_factor:.2f}x"


def latency_text(trace: Trace) -> str:
    """"0.0123 [0.0121–0.0127]" (ms), or the median alone where no interval is known."""
    return _text(trace, 0)


def reference_text(trace: Trace) -> str:
    """The reference's latency, as `latency_text`."""
    return _text(trace, 1)


def _text(trace: Trace, side: int) -> str:
    performance = trace.evaluation.performance
    if performance is None:
        return "—"
    pair = spreads(trace)
    if pair is not None:
        return pair[side].text()
    return f"{(performance.latency_ms, performance.reference_latency_ms)[side]:.4g}"

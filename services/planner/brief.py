"""What an assignment tells its writer besides the problem: the language, the parent to start from
and guidance drawn from recent failures. Pure functions over a few rows the tick reads."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

RECENT = 5  # finished attempts the guidance looks at
NOT_FAILED = ("PASSED", "PARTIAL")  # PARTIAL: passed the workloads it ran (a tuner's halving rung)
MESSAGE_CHARS = 200

WHAT_WENT_WRONG = {
    "COMPILE_ERROR": "failed to compile",
    "RUNTIME_ERROR": "crashed at run time",
    "TIMEOUT": "timed out",
    "INCORRECT_SHAPE": "wrote outputs of the wrong shape",
    "INCORRECT_DTYPE": "wrote outputs of the wrong dtype",
    "INCORRECT_NUMERICAL": "computed wrong values",
    "REWARD_HACK": "were flagged as reward hacks (timed below the speed of light or tampering)",
    "UNSUPPORTED": "used a language or dtype the device cannot run",
}


@dataclass(frozen=True)
class Candidate:
    """A PASSED solution of the problem that could be a parent, best first in the list given."""

    solution_hash: str
    language: str
    parent_hash: str | None


@dataclass(frozen=True)
class Recent:
    """A finished attempt, most recent first in the list given."""

    status: str
    message: str | None


@dataclass(frozen=True)
class Brief:
    language: str | None
    parent_hash: str | None
    guidance: str | None


def default_language(device: str) -> str:
    """`cuda` on a GPU (the fast path agents are steered to), `pytorch` on the CPU."""
    return "pytorch" if device == "cpu" else "cuda"


def parent_for(candidates: Sequence[Candidate], stall: int, diverse_after: int) -> Candidate | None:
    """The best solution; once the problem has stalled `diverse_after` attempts, a diverse one:
    the best in another language, else the best that is neither the best's parent nor its child."""
    if not candidates:
        return None
    best = candidates[0]
    if stall < diverse_after:
        return best
    others = candidates[1:]
    for candidate in others:
        if candidate.language != best.language:
            return candidate
    for candidate in others:
        if candidate.parent_hash != best.solution_hash and candidate.solution_hash != best.parent_hash:
            return candidate
    return best


def guidance(recent: Sequence[Recent], stall: int) -> str | None:
    """One or two sentences for the writer, or None when the recent attempts say nothing useful.

    "the last 5 attempts failed to compile: <first line of the latest error>" when the latest
    failures share a status; a breakdown when they differ; a nudge to change approach when the
    attempts pass without beating the best.
    """
    recent = list(recent[:RECENT])
    if not recent:
        return None
    streak = 0
    while streak < len(recent) and recent[streak].status == recent[0].status:
        streak += 1
    latest = recent[0]
    if latest.status not in NOT_FAILED and streak >= 2:
        what = WHAT_WENT_WRONG.get(latest.status, f"ended {latest.status}")
        return f"the last {streak} attempts {what}{_first_line(latest.message)}"
    failed = [r for r in recent if r.status not in NOT_FAILED]
    if len(failed) >= 2:
        counts = ", ".join(f"{n} {status}" for status, n in Counter(r.status for r in failed).most_common())
        return f"{len(failed)} of the last {len(recent)} attempts failed ({counts}); " \
               f"latest {failed[0].status}{_first_line(failed[0].message)}"
    if stall >= RECENT:
        return f"the last {stall} attempts did not beat the best: try a different approach, not a small variation"
    return None


def _first_line(message: str | None) -> str:
    for line in (message or "").splitlines():
        if line.strip():
            text = line.strip()
            return ": " + (text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS - 1] + "…")
    return ""

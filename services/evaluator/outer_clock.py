"""The outer clock: the evaluator's own time around each workload's timed batch, on a clock the
child's process cannot write.

Every child gets a private channel to the evaluator (a socket pair; its end is an inherited
descriptor whose number is in the job, `clock_fd`). Per workload, after the correctness rounds
and the warm-up, the child's harness sends `ready`; the evaluator hands over the timed input sets
(the candidate's timed seeds travel in the `go` reply, or its timed set files are moved into its
inputs folder from a folder it could not read), stamps `begin` with its own `time.monotonic()`
and answers `go`; the harness makes the timed sets, runs the timed loop, saves the timed outputs
and sends `end` with its runs, the sum of its samples and their median; the evaluator stamps
`end`. The window is end - begin. The reference child runs the same protocol, so that its window
calibrates what the batch costs beyond the runs themselves (making the sets, saving, the loop).
At the candidate's `end` the evaluator has that workload's outputs checked at once (`seal`: the
checker copies every output file before it reads it), so what is checked is what existed when the
window closed, not what the solution wrote after it; the next `go` waits for that check, so that
no checking competes with a timed batch. The reference's process, once its workloads are done,
says `checking` on its channel and becomes the attempt's checker (`checker.Checker`).

What the evaluator makes of a window (`retime`): a window longer than what the candidate reports
plus the reference's overhead per timed set, times `K_OVERHEAD`, plus `SLACK_MS` (`allowed_ms`), is
not a verdict: every `end` is answered, `sealed` (the batch stands) or `again` (the workload is timed
again, on fresh input sets the checker makes then, its outputs checked like the first batch's), up
to `EvalConfig.outer_clock_retimes` times; where no batch fits, the workload is charged what the
outer clock vouches for (`retime.charged_ms`). A candidate that reports a timed result for a
workload without the handshake for it, or unlike its last window, or breaks the protocol, forged
the result channel: REWARD_HACK (`forged`). What it reports is held at the median: the sum of its
samples counts only up to `SPREAD` times runs x median (a liar could otherwise put its hidden time
into a few made-up slow samples and keep a made-up median).

Thresholds (2026-12-03, the 2-core CPU VM of docs/results/hardening.md, shared with other sessions):
over 210 honest workloads of tests/evaluator and tests/hacks, the window exceeded what was reported
by at most 3.8 times the reference's overhead per set (2 to 6 sets of a few KiB to tens of MiB;
3.0 times beyond the first 5 ms), and by at most 15 ms on the affine problem's tiny sets. Hence
`K_OVERHEAD` 6 and `SLACK_MS` 100: about twice the worst seen. The allowance is tight for batches
whose runs take long against that slack and loose for kernels of a few microseconds, whose whole
batch fits in it (tests/hacks: `halves_the_clock_for_a_short_kernel` still passes; a frozen clock's
near-zero times are caught by the host clock's floor instead, `score.below_the_host_clock`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.evaluator.protocol import MAX_CHILD_LINE, send

log = logging.getLogger(__name__)

K_OVERHEAD = 6.0  # the candidate's batch may cost this many times the reference's overhead per set
SLACK_MS = 100.0  # plus this, per workload: scheduling and the evaluator's own reading of the channel
SPREAD = 1.5  # what it reports: at most this times runs x median


# --- the evaluator's side --------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """One workload's timed batch as the evaluator saw it (seconds of its own monotonic clock) and
    as the child reported it at `end` (None until then)."""
    uuid: str
    begin_s: float
    end_s: float | None = None
    runs: int | None = None  # the candidate's timed runs; the reference's timed sets
    total_ms: float | None = None  # the candidate's samples summed; the reference's own work in the window
    median_ms: float | None = None

    @property
    def window_ms(self) -> float:
        return ((self.end_s if self.end_s is not None else self.begin_s) - self.begin_s) * 1e3


class OuterClock:
    """Serves one child's channel in a thread while the evaluator waits for the child. `hand_over(uuid)`
    runs at `ready` (before `begin` is stamped) and returns what `go` carries; `seal(uuid, runs)` at
    `end`, then `retime(uuid, window)`: None closes the workload's batch (`sealed`), a payload opens
    a new window on it (`again`, `retime.Retimer`). Where `checker` (the reference's channel), a
    `checking` message ends the serving and sets `checking`: the channel is then the checker's
    (`checker.Checker`)."""

    def __init__(self, channel: socket.socket, uuids: list[str],
                 hand_over: Callable[[str], dict[str, Any]],
                 seal: Callable[[str, int, dict | None], None] | None = None, checker: bool = False,
                 retime: Callable[[str, Window], dict[str, Any] | None] | None = None) -> None:
        self.channel, self.uuids, self.hand_over, self.seal = channel, uuids, hand_over, seal
        self.retime = retime
        self.windows: dict[str, Window] = {}  # the last window per workload
        self.batches: dict[str, list[Window]] = {}  # every closed window per workload, in order
        self.violation: str | None = None
        self.accepts_checking = checker
        self.checking = threading.Event()
        self._open: str | None = None  # the workload whose `go` was sent last, until its `end`
        self._thread = threading.Thread(target=self._serve, name="outer-clock", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """After the child has ended: no more messages (a descendant may still hold its end)."""
        try:
            self.channel.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed by the other side
        self._thread.join(timeout=10)
        self.channel.close()

    def join(self) -> None:
        """The serving thread's end, the channel left open (after `checking`)."""
        self._thread.join(timeout=10)

    def _serve(self) -> None:
        try:
            with self.channel.makefile("rb") as reader:  # the reference sends nothing after `checking`
                self._read(reader)                     # until asked: nothing of the checker's is buffered
        except OSError:
            return  # the channel was shut down: the child is gone
        finally:
            if self.violation:  # nothing more is answered; the child's harness sees the channel close
                with contextlib.suppress(OSError):
                    self.channel.shutdown(socket.SHUT_RDWR)

    def _read(self, reader) -> None:
        while True:
            line = reader.readline(MAX_CHILD_LINE)
            now = time.monotonic()
            if not line:
                return
            self.violation = self._take(line, now)
            if self.violation or self.checking.is_set():
                return

    def _take(self, line: bytes, now: float) -> str | None:
        """One message; a violation of the protocol as text, or None."""
        try:
            message = json.loads(line)
            op, uuid = message["op"], message["uuid"]
        except (ValueError, KeyError, TypeError):
            return f"a message that is not the protocol's on the evaluator's channel: {line[:200]!r}"
        if op == "ready":
            done = [self.uuids.index(u) for u in self.windows]
            if uuid not in self.uuids or uuid in self.windows or (done and self.uuids.index(uuid) < max(done)):
                return f"`ready` for workload {uuid!r} out of order on the evaluator's channel"
            try:
                payload = self.hand_over(uuid)
            except OSError as error:  # its timed set files gone: taken or removed by the child
                return f"the timed input sets of workload {uuid} could not be handed over: {error}"
            self.windows[uuid], self._open = Window(uuid, time.monotonic()), uuid
            send(self.channel, {"op": "go", **payload})
            return None
        if op == "checking" and self.accepts_checking and self._open is None:
            self.checking.set()
            return None
        if op == "end":
            if self._open is None or self._open != uuid:
                return f"`end` for workload {uuid!r} without its `ready` on the evaluator's channel"
            try:
                runs, total, median = int(message["runs"]), float(message["total_ms"]), float(message["median_ms"])
            except (KeyError, TypeError, ValueError):
                return f"an `end` the evaluator cannot read: {line[:200]!r}"
            window = self.windows[uuid] = Window(uuid, self.windows[uuid].begin_s, now, runs, total, median)
            self.batches.setdefault(uuid, []).append(window)
            self._open = None
            shared = message.get("shared")
            if shared is not None and not isinstance(shared, dict):
                return f"an `end` whose shared output sets the evaluator cannot read: {line[:200]!r}"
            if self.seal is not None:  # its outputs checked as they are now, before any later `go`
                self.seal(uuid, runs, shared)
            again = self.retime(uuid, window) if self.retime is not None else None
            if again is None:  # the checker has its copies: the candidate may let them go
                send(self.channel, {"op": "sealed"})
                return None
            self.windows[uuid], self._open = Window(uuid, time.monotonic()), uuid
            send(self.channel, {"op": "again", **again})
            return None
        return f"an unknown message on the evaluator's channel: {line[:200]!r}"


def overhead_per_set_ms(reference: Window) -> float:
    """The reference's cost of its timed batch beyond its own work, per timed set it made:
    (window - work) / sets. Its work (the reference's calls) it measures itself; it is trusted."""
    return max(0.0, reference.window_ms - (reference.total_ms or 0.0)) / max(reference.runs or 1, 1)


def accounted_ms(window: Window) -> float:
    """What the candidate's report accounts for in its window: the sum of its samples, at most
    `SPREAD` x runs x median."""
    return min(window.total_ms or 0.0, SPREAD * (window.runs or 0) * (window.median_ms or 0.0))


def allowed_ms(window: Window, reference: Window, timed_sets: int, slack_ms: float = SLACK_MS) -> float:
    """The longest window that the report explains: what it accounts for, plus the reference's
    overhead per set for every set handed over, times `K_OVERHEAD`, plus `slack_ms`. A longer one
    is timed again, and charged where it stays longer (`retime`); it is never a verdict."""
    return accounted_ms(window) + K_OVERHEAD * timed_sets * overhead_per_set_ms(reference) + slack_ms


def forged(latency: dict[str, Any], window: Window | None) -> str | None:
    """Why a workload the candidate reports as timed is a forged result (REWARD_HACK), or None:
    no window opened and closed for it on the private channel, or a report unlike that window's.
    `latency` is its result's; `window` the last one the evaluator saw for the workload."""
    if window is None or window.end_s is None:
        return ("the solution's process reported timed results for a workload whose timed batch the evaluator "
                "never saw begin and end on its private channel (a forged result)")
    if window.runs != latency.get("runs") or window.median_ms != latency.get("median_ms"):
        return (f"the timed results differ between the evaluator's channel ({window.runs} runs, median "
                f"{window.median_ms} ms) and the result file ({latency.get('runs')} runs, median "
                f"{latency.get('median_ms')} ms): a forged result")
    return None


def move_timed_sets(timed_dir: Path, inputs_dir: Path, index: int, sets: range) -> None:
    """Timed set files of workload `index` moved from `timed_dir`, which the candidate cannot read,
    into its inputs folder."""
    for s in sets:
        name = f"w{index}_s{s}.st"
        (timed_dir / name).chmod(0o644)  # readable where the candidate runs as `nobody`
        (timed_dir / name).rename(inputs_dir / name)


def timed_hand_over(timed_dir: Path, inputs_dir: Path, rounds: int,
                    workloads: dict[str, tuple[int, dict[str, Any]]]) -> Callable[[str], dict[str, Any]]:
    """The evaluator's `hand_over` for the candidate: at workload `uuid`'s `ready`, its timed sets'
    seeds and digests (the `go` carries them), or its timed set files moved from `timed_dir`, which
    the candidate cannot read, into its inputs folder. `workloads`: uuid -> (index, the reference's
    result for it)."""
    def hand_over(uuid: str) -> dict[str, Any]:
        index, made = workloads[uuid]
        if made.get("set_seeds") is not None:
            return {"set_seeds": made["set_seeds"][rounds:], "set_digests": made["set_digests"][rounds:]}
        move_timed_sets(timed_dir, inputs_dir, index, range(rounds, rounds + made["timed_sets"]))
        return {"set_seeds": None}

    return hand_over

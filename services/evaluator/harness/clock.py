"""The child's end of the outer clock (`services/evaluator/outer_clock.py` says the protocol): per
workload, `ready` before the timed batch (the evaluator answers `go` with what it hands over) and
`end` after it, which waits for the evaluator's answer: `sealed`, or `again` (a re-time, `retime`).
"""

from __future__ import annotations

import json
import socket
from typing import Any

from services.evaluator.protocol import MAX_GO_LINE, Job, send


class ClockLost(RuntimeError):
    """The harness's channel closed or answered out of turn: the timed batch cannot start."""


class HarnessClock:
    """The child's end of the channel: `ready` before its timed batch, `end` after it."""

    def __init__(self, fd: int) -> None:
        self._socket = socket.socket(fileno=fd)
        self._reader = self._socket.makefile("rb")

    @classmethod
    def from_job(cls, job: Job) -> HarnessClock | None:
        fd = job.clock_fd
        return cls(fd) if isinstance(fd, int) else None

    def ready(self, uuid: str) -> dict[str, Any]:
        """Ask for the timed batch of workload `uuid`; returns what the evaluator hands over with `go`."""
        try:
            send(self._socket, {"op": "ready", "uuid": uuid})
            line = self._reader.readline(MAX_GO_LINE)
        except OSError as error:  # the evaluator closed the channel first (after a violation)
            raise ClockLost(f"the evaluator's channel is closed: {error}") from None
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if not isinstance(message, dict) or message.get("op") != "go":
            raise ClockLost(f"the evaluator's channel gave no `go` for workload {uuid} (got {line[:200]!r})")
        return message

    def channel(self) -> tuple[socket.socket, Any]:
        """The socket and its reader, for what follows the timed batches on it (`checker.serve`)."""
        return self._socket, self._reader

    def end(self, uuid: str, runs: int, total_ms: float, median_ms: float,
            shared: dict[int, Any] | None = None) -> dict[str, Any] | None:
        """The batch's end; waits for the evaluator's answer. `sealed` (None here): its outputs
        are checked and the window closed (with `shared`, output sets in GPU memory, `gpu_handover`,
        the checker has its copies). `again` (its message here): the window was over its allowance
        and the workload is timed again, on the fresh sets it carries (`retime`)."""
        message = {"op": "end", "uuid": uuid, "runs": runs, "total_ms": total_ms, "median_ms": median_ms}
        try:
            send(self._socket, message if shared is None else {**message, "shared": shared})
            line = self._reader.readline(MAX_GO_LINE)
        except OSError as error:
            raise ClockLost(f"the evaluator's channel is closed: {error}") from None
        try:
            answer = json.loads(line)
        except ValueError:
            answer = None
        if isinstance(answer, dict) and answer.get("op") == "sealed":
            return None
        if isinstance(answer, dict) and answer.get("op") == "again":
            return answer
        raise ClockLost(f"the evaluator's channel gave no `sealed` for workload {uuid} (got {line[:200]!r})")

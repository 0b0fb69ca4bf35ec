"""The attempt's checker: the reference's own process, kept alive after its workloads, holds the
expected outputs in its memory (on the GPU where it runs on one) and checks the candidate's outputs
there. The expected outputs are never written to a file, never copied into the evaluator, and never
cross a process boundary; only verdicts come back.

Protocol, on the reference's private channel (the outer clock's socket pair): once its results are
written, the reference says `{"op": "checking"}` (the outer clock's thread stops serving the
channel at that line, and `finish_child` returns with the child still running). The evaluator then
sends `{"op": "check", "index": i, "runs": n, "outputs_dir": ...}` per workload (at the candidate's
`end` where the outer clock is on, else after the candidate) and reads one line back: the `Check`
as a dict. `{"op": "quit"}`, or the channel closing, ends the checker; the evaluator kills its
process group anyway.

The checker is trusted code only (the harness's checks); the candidate's output files are read
with `checks.read_regular` (a copy taken at that moment, regular files only), as before.
"""

from __future__ import annotations

import json
import socket
import traceback
from pathlib import Path
from typing import Any

import torch

from services.evaluator.checks import check_sets
from services.evaluator.correctness import Check
from services.evaluator.sandbox import StartedChild
from shared.schema import Definition, Status, Workload

MAX_REPLY = 1 << 16
MAX_REQUEST = 1 << 22  # a `check` carries the shared sets' handles


# --- the evaluator's side --------------------------------------------------------------------------


class Checker:
    """The evaluator's handle on the reference's process once it said `checking`."""

    def __init__(self, child: StartedChild, timeout_s: float) -> None:
        self.child = child
        child.channel.settimeout(timeout_s)
        self._reader = child.channel.makefile("rb")
        self._lost: str | None = None  # once a reply is missing or out of turn, no later one is trusted

    def check(self, index: int, runs: int, outputs_dir: Path, shared: dict | None = None) -> Check:
        """Workload `index`'s correctness rounds and first `runs` timed runs, as they are now: from
        their files, or from the candidate's GPU memory for the sets in `shared` (`gpu_handover`)."""
        if self._lost is None:
            try:
                _send(self.child.channel, {"op": "check", "index": index, "runs": runs,
                                           "outputs_dir": str(outputs_dir), "shared": shared})
                line = self._reader.readline(MAX_REPLY)
                reply = json.loads(line) if line else None
            except (OSError, ValueError) as error:
                reply, line = None, str(error).encode()
            if isinstance(reply, dict) and "status" in reply and reply.get("index") == index:
                return Check.from_dict(reply)
            self._lost = repr(line[:200])
        return Check(Status.RUNTIME_ERROR, f"the attempt's checker (the reference's process) stopped answering "
                                           f"before it checked these outputs ({self._lost}); not the solution's "
                                           f"verdict")

    def close(self) -> None:
        try:
            _send(self.child.channel, {"op": "quit"})
        except OSError:
            pass  # already gone
        self._reader.close()
        self.child.kill()


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(json.dumps(message).encode() + b"\n")


# --- the reference's side (in its child process) ---------------------------------------------------


def open_channel(fd: int) -> tuple[socket.socket, Any]:
    sock = socket.socket(fileno=fd)
    return sock, sock.makefile("rb")


def serve(sock: socket.socket, reader, job: dict[str, Any], definition: Definition, workloads: dict[int, Workload],
          expected: dict[str, dict[str, Any]], device: torch.device) -> None:
    """Answer `check` requests until `quit` or the channel closes. Each workload's expected sets
    are dropped once it has been checked (it is checked once)."""
    from services.evaluator.sandbox import protect_self

    protect_self()  # from here the process outlives its own work, beside the candidate's
    _send(sock, {"op": "checking", "uuid": ""})
    rounds = job["correctness_rounds"]
    while True:
        line = reader.readline(MAX_REQUEST)
        if not line:
            return
        message = json.loads(line)
        if message.get("op") != "check":
            return
        index = int(message["index"])
        importer = None
        try:
            shared = {int(s): d for s, d in (message.get("shared") or {}).items()}
            if shared:
                from services.evaluator import gpu_handover

                gpu_handover.bind(device)
                importer = gpu_handover.Importer(device)
            check = check_sets(definition, workloads[index].effective_tolerance, index, rounds, int(message["runs"]),
                               Path(message["outputs_dir"]), expected, device, shared, importer)
            reply = check.as_dict()
        except Exception:  # the harness's own failure: said as such, never a pass
            reply = Check(Status.RUNTIME_ERROR, "the checker failed:\n" + traceback.format_exc()[-2000:]).as_dict()
        finally:
            if importer is not None:
                importer.close()  # before the reply: then the candidate may free what was shared
        for name in [n for n in expected if n.startswith(f"w{index}_s")]:
            del expected[name]
        _send(sock, {**reply, "index": index})

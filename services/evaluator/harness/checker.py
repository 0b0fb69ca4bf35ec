"""The attempt's checker: the reference's own process, kept alive after its workloads, holds the
expected outputs in its memory (on the GPU where it runs on one) and checks the candidate's outputs
there. The expected outputs are never written to a file, never copied into the evaluator, and never
cross a process boundary; only verdicts come back.

Protocol, on the reference's private channel (the outer clock's socket pair): once its results are
written, the reference says `{"op": "checking"}` (the outer clock's thread stops serving the
channel at that line, and `finish_child` returns with the child still running). The evaluator then
sends `{"op": "check", "index": i, "runs": n, "files": [set numbers]}` per workload (at the
candidate's `end` where the outer clock is on, else after the candidate), with a descriptor of each
named set's output file (`protocol.send_with_fds`: the checker, confined as the reference and as a
user of its own, neither sees nor may read the candidate's folder), and reads one line back: the
`Check` as a dict. `{"op": "quit"}`, or the channel closing, ends the checker; the evaluator kills its
process group anyway. The evaluator's end is `children.Checker`. Where the outer clock re-times a
workload (`retime`), the evaluator first sends `{"op": "more", "index": i, "first": s, "count": n}`:
the checker makes `n` fresh input sets from its own seeds, runs the reference on them and holds
their expected outputs, and answers their seeds and digests (or `set_seeds` None: files saved where
the candidate cannot read them until they are handed over); the `check` of that batch then carries
`first`.

The checker runs only the harness's checks, but in the reference's process, which ran a problem's
code: it is confined as the candidate is. The candidate's output files are read from their
descriptors with `checks.read_regular` (a copy taken at that moment, regular files only).
"""

from __future__ import annotations

import json
import os
import socket
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from services.evaluator.harness.checks import check_sets
from services.evaluator.harness.correctness import Check
from services.evaluator.protocol import MAX_CHECK_REQUEST, ReferenceJob, receive_with_fds, send
from shared.process import protect_self
from shared.schema import Definition, Status, Workload



def _files_announced(line: bytes) -> int:
    """How many descriptors a request says follow it (a `check`'s output files)."""
    try:
        return len(json.loads(line).get("files") or ())
    except (ValueError, AttributeError):
        return 0


def open_channel(fd: int) -> tuple[socket.socket, Any]:
    sock = socket.socket(fileno=fd)
    return sock, sock.makefile("rb")


def serve(sock: socket.socket, reader, job: ReferenceJob, definition: Definition, workloads: dict[int, Workload],
          expected: dict[str, dict[str, Any]], device: torch.device,
          make_sets: Callable[[int, int, int], dict[str, Any]] | None = None) -> None:
    """Answer `check` and `more` requests until `quit` or the channel closes. Each workload's
    expected sets are dropped once they have been checked; `more` (a re-timed batch, `retime`)
    makes fresh ones with `make_sets(index, first, count)` (`reference_role.more_sets`)."""
    protect_self()  # from here the process outlives its own work, beside the candidate's
    send(sock, {"op": "checking", "uuid": ""})
    rounds = job.correctness_rounds
    while True:
        # Read with recvmsg, not `reader`: a `check` brings the output files' descriptors. Nothing
        # is left in `reader`'s buffer: the evaluator sends nothing after the outer clock's last
        # reply until it asks.
        line, fds = receive_with_fds(sock, MAX_CHECK_REQUEST, _files_announced)
        if not line:
            return
        message = json.loads(line)
        files = dict(zip((int(s) for s in message.get("files") or ()), fds))
        for fd in fds[len(files):]:
            os.close(fd)  # more than it announced: not ours
        if message.get("op") == "more" and make_sets is not None:
            index = int(message["index"])
            try:
                reply = make_sets(index, int(message["first"]), int(message["count"]))
            except Exception:  # the harness's own failure: said as such
                reply = {"error": "making fresh timed sets failed:\n" + traceback.format_exc()[-2000:]}
            send(sock, {**reply, "index": index})
            continue
        if message.get("op") != "check":
            return
        index = int(message["index"])
        first = message.get("first")
        importer = None
        try:
            shared = {int(s): d for s, d in (message.get("shared") or {}).items()}
            if shared:
                from services.evaluator.harness import gpu_handover

                gpu_handover.bind(device)
                importer = gpu_handover.Importer(device)
            check = check_sets(definition, workloads[index].effective_tolerance, index, rounds, int(message["runs"]),
                               files, expected, device, shared, importer,
                               first=int(first) if first is not None else None)
            reply = check.as_dict()
        except Exception:  # the harness's own failure: said as such, never a pass
            reply = Check(Status.RUNTIME_ERROR, "the checker failed:\n" + traceback.format_exc()[-2000:]).as_dict()
        finally:
            for fd in files.values():
                os.close(fd)
            if importer is not None:
                importer.close()  # before the reply: then the candidate may free what was shared
        for name in [n for n in expected if n.startswith(f"w{index}_s")]:
            del expected[name]
        send(sock, {**reply, "index": index})

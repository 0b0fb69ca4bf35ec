"""What crosses the evaluator's process boundaries: the private channel between the evaluator and
each child (its message size limits and one `send`), and the files a child leaves for the
evaluator (its home's ready marker).

Messages on the private channel are JSON objects, one per line. The outer clock's (`ready`, `go`,
`end`, `sealed`, `outer_clock.py`) and the checker's (`checking`, `check`, `quit` and the `Check`
replies, `harness/checker.py`) share it: the reference's channel becomes the checker's at its
`checking` line. Imported by the host side and the harness alike: nothing here imports either.
"""

from __future__ import annotations

import json
import socket
from typing import Any

READY_FILE = ".ready"  # written by a spare child in its home once warm; the evaluator waits for it

# The channel's limits: the longest line each side reads.
MAX_CHILD_LINE = 1 << 22  # the evaluator reads no longer line from a child (an `end` carries its sets' handles)
MAX_GO_LINE = 1 << 24  # the harness reads the evaluator's `go`: seeds and digests of every timed set
MAX_CHECK_REPLY = 1 << 16  # the evaluator reads the checker's verdict on one workload
MAX_CHECK_REQUEST = 1 << 22  # the checker reads a `check`: it carries the shared sets' handles


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    """One message on a private channel: a JSON object on a line of its own."""
    sock.sendall(json.dumps(message).encode() + b"\n")

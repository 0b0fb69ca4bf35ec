"""Logging for entry points: one line per event, key=value pairs after the message."""

from __future__ import annotations

import logging
import sys

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _Stderr(logging.StreamHandler):
    """`sys.stderr` as it was when the handler was made, until that stream is closed: then the
    `sys.stderr` of the moment (a command run in process, as tests and `kernelswarm` calling another
    command do, may replace it and close the old one). Not the stream of the moment throughout: a
    Celery worker replaces `sys.stderr` with a proxy that logs what is written to it, and a line
    written there would come back to this handler, which the proxy drops."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(self.stream, "closed", False):
            current = sys.stderr
            self.stream = sys.__stderr__ if current is None or getattr(current, "closed", False) else current
        super().emit(record)


def configure_logging(level: str = "INFO") -> None:
    root = logging.getLogger()
    if not any(getattr(h, "_kernelswarm", False) for h in root.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter(FORMAT))
        handler._kernelswarm = True
        root.addHandler(handler)
    root.setLevel(level.upper())

"""Logging for entry points: one line per event, key=value pairs after the message."""

from __future__ import annotations

import logging
import sys

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _Stderr(logging.StreamHandler):
    """Whatever `sys.stderr` is when a line is written, not when the handler was made: a command run
    in process (tests, `kernelswarm` calling another command) may replace it and close the old one."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def configure_logging(level: str = "INFO") -> None:
    root = logging.getLogger()
    if not any(getattr(h, "_kernelswarm", False) for h in root.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter(FORMAT))
        handler._kernelswarm = True
        root.addHandler(handler)
    root.setLevel(level.upper())

"""Types of the `kernelswarm` command's numeric arguments: each number bounded, so that a bad one is
refused by argparse (exit code 2, the argument named, no traceback) before anything runs.

Ids and counts fit the DB's INTEGER column (32-bit on PostgreSQL; a larger one ended in an
OverflowError traceback from SQLite's driver); ports are 1-65535; durations and limits are finite
and above zero (a negative memory limit used to remove the limit).
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

MAX_DB_INTEGER = 2**31 - 1  # PostgreSQL's INTEGER, the narrower of the two databases
MAX_SECONDS = 10**9  # about 31 years; Python's own timeouts stop at about 9.2e9 s
MAX_MEMORY_MB = 1 << 30  # a PiB: RLIMIT_AS in bytes stays far inside 64 bits


def whole(low: int, high: int, what: str) -> Callable[[str], int]:
    """An argparse type: a whole number from `low` to `high`."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is out of range: {what} is from {low} to {high}")
        return value

    parse.__name__ = what  # argparse names the type in some of its messages
    return parse


def positive_seconds(text: str) -> float:
    """An argparse type: seconds, finite and above zero (at most MAX_SECONDS)."""
    try:
        value = float(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or not 0 < value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text} is out of range: seconds above 0, at most {MAX_SECONDS}")
    return value


db_id = whole(1, MAX_DB_INTEGER, "an id")
count = whole(1, MAX_DB_INTEGER, "a count")
port = whole(1, 65535, "a port")
mebibytes = whole(1, MAX_MEMORY_MB, "a size in MiB")


def writable_file(path: Path) -> str | None:
    """None when `path` can be written (its folder exists and takes a new file; the file itself, if
    there, is a file that may be written); otherwise why not. Nothing is left behind."""
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        return f"{path} is a folder"
    if not folder.is_dir():
        return f"{folder} is not a folder"
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        return f"cannot write in {folder}: {error.strerror or error}"
    if path.exists() and not os.access(path, os.W_OK):
        return f"{path} may not be written"
    return None

"""Fixtures of the GPU tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def readable_tmp() -> Iterator[Path]:
    """A folder others may read, outside /tmp, for the tests' problems: pytest's own temp folders
    are the evaluator's only (0700), where a reference runs as the evaluator's uid without
    capabilities; here it runs as its user of its own, as for the library's problems."""
    folder = Path(tempfile.mkdtemp(prefix="ks-gpu-", dir="/var/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)

"""Fixtures for the evaluator tests; the helpers themselves live in `evalkit`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from evalkit import affine_definition, affine_workloads, make_problem
from services.evaluator.sandbox.isolation import WRITABLE_ENV
from shared.runtime import Runtime
from shared.schema import Problem
from shared.settings import Settings

PROBLEMS = Path(__file__).resolve().parents[2] / "problems"


@pytest.fixture
def affine(tmp_path: Path) -> Problem:
    """The float32 affine problem with two workloads (n = 3 and n = 7)."""
    return make_problem(tmp_path, affine_definition("float32"), affine_workloads("float32"))


@pytest.fixture
def drop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder a candidate writes what a test reads after the attempt: writable whoever it runs as,
    and left writable in its otherwise read-only view (`sandbox.WRITABLE_ENV`)."""
    folder = tmp_path / "drop"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    monkeypatch.setenv(WRITABLE_ENV, str(folder))
    return folder


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    """A DB and object store under tmp_path, the shipped problems as its library."""
    runtime = Runtime(Settings(home=tmp_path, problems_dir=PROBLEMS))
    yield runtime
    runtime.db.dispose()

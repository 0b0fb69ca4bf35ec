"""Fixtures for the evaluator tests; the helpers themselves live in `evalkit`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from evalkit import affine_definition, affine_workloads, make_problem
from shared.runtime import Runtime
from shared.schema import Problem
from shared.settings import Settings

PROBLEMS = Path(__file__).resolve().parents[2] / "problems"


@pytest.fixture
def affine(tmp_path: Path) -> Problem:
    """The float32 affine problem with two workloads (n = 3 and n = 7)."""
    return make_problem(tmp_path, affine_definition("float32"), affine_workloads("float32"))


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    """A DB and object store under tmp_path, the shipped problems as its library."""
    runtime = Runtime(Settings(home=tmp_path, problems_dir=PROBLEMS))
    yield runtime
    runtime.db.dispose()

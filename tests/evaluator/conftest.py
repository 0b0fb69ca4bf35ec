"""Fixtures for the evaluator tests; the helpers themselves live in `evalkit`."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalkit import affine_definition, affine_workloads, make_problem
from shared.schema import Problem


@pytest.fixture
def affine(tmp_path: Path) -> Problem:
    """The float32 affine problem with two workloads (n = 3 and n = 7)."""
    return make_problem(tmp_path, affine_definition("float32"), affine_workloads("float32"))

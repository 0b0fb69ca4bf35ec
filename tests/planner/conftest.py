"""Fixtures for the planner tests: a fresh SQLite DB, the project's three problems, a write queue."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from plannerkit import WriteQueue
from shared.db import Database
from shared.repository import upsert_problem
from shared.schema import load_problem

PROBLEMS = Path(__file__).resolve().parents[2] / "problems"
NAMES = ("llama31_8b_gemm_o_proj", "llama31_8b_rmsnorm", "llama31_8b_swiglu")


@pytest.fixture
def db(tmp_path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path}/planner.db")
    yield database
    database.dispose()


@pytest.fixture
def problem_ids(db) -> list[int]:
    with db.session() as session:
        return [upsert_problem(session, load_problem(PROBLEMS / name)).id for name in NAMES]


@pytest.fixture
def queue(db) -> WriteQueue:
    return WriteQueue(db)

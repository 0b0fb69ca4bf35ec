"""A migrated SQLite DB per test and a small helper that writes rows the way the services do."""

from __future__ import annotations

import hashlib
import itertools
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest


from shared.db.models import AttemptRow, CampaignProblemRow, CampaignRow, ProblemRow, SolutionRow
from shared.db.session import Database

T0 = datetime(2026, 1, 1, 12, 0, 0)


class Seed:
    """Writes problems, solutions, campaigns and attempts; each call is its own transaction."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._counter = itertools.count()

    def problem(self, name: str, op_type: str | None = "gemm") -> int:
        with self.db.session() as session:
            row = ProblemRow(name=name, op_type=op_type, definition_json="{}", workloads_jsonl="")
            session.add(row)
            session.flush()
            return row.id

    def campaign(self, problem_ids: list[int], name: str = "c") -> int:
        with self.db.session() as session:
            row = CampaignRow(name=name)
            session.add(row)
            session.flush()
            for position, problem_id in enumerate(problem_ids):
                session.add(CampaignProblemRow(campaign_id=row.id, problem_id=problem_id, position=position))
            return row.id

    def attempt(
        self,
        problem_id: int,
        status: str,
        *,
        speedup: float | None = None,
        latency_ms: float | None = None,
        minute: int = 0,
        campaign_id: int | None = None,
        language: str = "cuda",
        author: str = "writer-1",
    ) -> str:
        """One solution plus one attempt finished `minute` minutes after T0 (in flight: not finished)."""
        n = next(self._counter)
        solution_hash = hashlib.sha256(f"solution-{n}".encode()).hexdigest()
        attempt_id = str(uuid.uuid4())
        finished = status not in ("PENDING", "RUNNING")
        passed = status == "PASSED"
        with self.db.session() as session:
            session.add(SolutionRow(hash=solution_hash, problem_id=problem_id, name=f"s{n}", author=author,
                                    language=language))
            session.flush()
            session.add(AttemptRow(
                id=attempt_id, problem_id=problem_id, solution_hash=solution_hash, campaign_id=campaign_id,
                status=status, device="cpu", workloads_total=2, workloads_passed=2 if passed else 0,
                latency_ms=latency_ms, speedup=speedup,
                created_at=T0 + timedelta(minutes=minute) - timedelta(seconds=30),
                finished_at=T0 + timedelta(minutes=minute) if finished else None,
            ))
        return attempt_id


@pytest.fixture
def db(tmp_path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path}/t.db")
    yield database
    database.dispose()


@pytest.fixture
def seed(db: Database) -> Seed:
    return Seed(db)

"""Helpers for the planner tests: a `send_write` that checks commits, and rows written directly."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from sqlalchemy import func, select

from shared.db import AssignmentRow, AttemptRow, CampaignProblemRow, Database, ProblemRow, SolutionRow

T0 = datetime(2026, 1, 1, 12, 0, 0)
ACTIVE = ("QUEUED", "RUNNING")


class WriteQueue:
    """`send_write` that checks, from a fresh session, that the assignment it is sent is committed."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.sent: list[int] = []
        self.problems: list[int] = []  # the problem each sent assignment is for, in order

    def __call__(self, assignment_ids) -> None:
        with self.db.session() as session:
            for assignment_id in assignment_ids:
                row = session.get(AssignmentRow, assignment_id)
                assert row is not None, f"assignment {assignment_id} sent before its commit"
                assert row.status == "QUEUED"
                self.problems.append(row.problem_id)
                self.sent.append(assignment_id)


def add_problems(db: Database, count: int, prefix: str = "p") -> list[int]:
    """Problem rows without a folder (the planner never reads a problem's definition)."""
    with db.session() as session:
        rows = [ProblemRow(name=f"{prefix}{uuid.uuid4().hex[:8]}-{i}", definition_json="{}", workloads_jsonl="")
                for i in range(count)]
        session.add_all(rows)
        session.flush()
        return [r.id for r in rows]


class Attempts:
    """Writes one solution and one attempt per call; `minute` orders them (finished 30 s later)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def add(self, problem_id: int, campaign_id: int | None, status: str, speedup: float | None = None,
            latency_ms: float | None = None, minute: float = 0, assignment_id: int | None = None,
            sol_score: float | None = None, gpu_seconds: float | None = None, tokens: int = 0,
            message: str | None = None, language: str = "pytorch", parent_hash: str | None = None,
            created_at: datetime | None = None) -> str:
        digest = uuid.uuid4().hex + uuid.uuid4().hex
        attempt_id = str(uuid.uuid4())
        created = created_at or T0 + timedelta(minutes=minute)
        with self.db.session() as session:
            session.add(SolutionRow(hash=digest, problem_id=problem_id, name=f"s-{digest[:6]}", author="tests",
                                    language=language, parent_hash=parent_hash))
            session.flush()
            session.add(AttemptRow(id=attempt_id, problem_id=problem_id, solution_hash=digest, campaign_id=campaign_id,
                                   assignment_id=assignment_id, status=status, device="cpu", speedup=speedup,
                                   latency_ms=latency_ms, sol_score=sol_score, gpu_seconds=gpu_seconds, tokens=tokens,
                                   message=message, created_at=created,
                                   finished_at=None if status in ("PENDING", "RUNNING")
                                   else created + timedelta(seconds=30)))
        return attempt_id

    def solution_of(self, attempt_id: str) -> str:
        with self.db.session() as session:
            return session.get(AttemptRow, attempt_id).solution_hash


def active(db: Database, campaign_id: int) -> int:
    with db.session() as session:
        return session.scalar(select(func.count()).select_from(AssignmentRow).where(
            AssignmentRow.campaign_id == campaign_id, AssignmentRow.status.in_(ACTIVE)))


def assignments(db: Database, campaign_id: int) -> list[AssignmentRow]:
    with db.session() as session:
        return list(session.scalars(select(AssignmentRow).where(AssignmentRow.campaign_id == campaign_id)
                                    .order_by(AssignmentRow.id)))


def close(db: Database, assignment_id: int, status: str = "DONE") -> None:
    """What the writer does at the end of an assignment."""
    with db.session() as session:
        row = session.get(AssignmentRow, assignment_id)
        row.status, row.finished_at = status, T0


def best_of(db: Database, campaign_id: int, problem_id: int) -> str | None:
    with db.session() as session:
        return session.get(CampaignProblemRow, (campaign_id, problem_id)).best_attempt_id

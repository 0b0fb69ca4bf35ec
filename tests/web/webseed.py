"""Rows written the way the services write them, for the web tests: problems (synthetic or from
problems/), campaigns, attempts and per-workload traces."""

from __future__ import annotations

import hashlib
import itertools
import json
import uuid
from datetime import datetime, timedelta
from pathlib import Path

from shared.db.models import (
    AttemptRow,
    CampaignProblemRow,
    CampaignRow,
    ProblemRow,
    SolutionRow,
    TraceRow,
)
from shared.db.session import Database
from shared.repository import upsert_problem
from shared.schema import load_problem
from shared.store import LocalStore

T0 = datetime(2026, 1, 1, 12, 0, 0)
REPO = Path(__file__).resolve().parents[2]
PROBLEMS = REPO / "problems"
TOKEN = "kTq3v9XzR2mLw8YpN4sHc7JdF6bGa1Ue5oQiVrZt0Ex"  # a fixed random 43-character token (tokens.py refuses weak ones)


class Seed:
    """Writes problems, solutions, campaigns, attempts and traces; each call is its own transaction."""

    def __init__(self, db: Database, store: LocalStore | None = None) -> None:
        self.db = db
        self.store = store
        self._counter = itertools.count()

    def problem(self, name: str, op_type: str | None = "gemm", hf_id: str | None = None) -> int:
        definition = json.dumps({"name": name, "hf_id": hf_id} if hf_id else {})
        with self.db.session() as session:
            row = ProblemRow(name=name, op_type=op_type, definition_json=definition, workloads_jsonl="")
            session.add(row)
            session.flush()
            return row.id

    def real_problem(self, folder: str) -> int:
        """One of problems/ as `kernelswarm up` loads it."""
        with self.db.session() as session:
            return upsert_problem(session, load_problem(PROBLEMS / folder)).id

    def campaign(self, problem_ids: list[int], name: str = "c", status: str = "RUNNING", device: str = "cpu") -> int:
        with self.db.session() as session:
            row = CampaignRow(name=name, status=status, device=device)
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
        sol_score: float | None = None,
        minute: int = 0,
        campaign_id: int | None = None,
        language: str = "cuda",
        author: str = "writer-1",
        model: str | None = None,
        tokens: int = 0,
        gpu_seconds: float | None = None,
        message: str | None = None,
        worker: str | None = None,
        evaluator: str | None = None,
        started_at: datetime | None = None,
        solution_hash: str | None = None,
        parent_hash: str | None = None,
        traces_hash: str | None = None,
        finished_at: datetime | None = None,
        device: str = "cpu",
        hardware: str | None = None,
        kind: str = "evaluate",
    ) -> str:
        """One solution (unless `solution_hash` names a stored one) plus one attempt finished
        `minute` minutes after T0 (in flight: not finished); `kind` a verdict or a diagnostic tool's."""
        n = next(self._counter)
        attempt_id = str(uuid.uuid4())
        finished = status not in ("PENDING", "RUNNING")
        passed = status == "PASSED"
        with self.db.session() as session:
            if solution_hash is None:
                solution_hash = hashlib.sha256(f"solution-{n}".encode()).hexdigest()
                session.add(SolutionRow(hash=solution_hash, problem_id=problem_id, name=f"s{n}", author=author,
                                        language=language, parent_hash=parent_hash))
                session.flush()
            session.add(AttemptRow(
                id=attempt_id, problem_id=problem_id, solution_hash=solution_hash, campaign_id=campaign_id,
                status=status, device=device, hardware=hardware, kind=kind, workloads_total=2,
                workloads_passed=2 if passed else 0, latency_ms=latency_ms, speedup=speedup, sol_score=sol_score,
                model=model, tokens=tokens, gpu_seconds=gpu_seconds, message=message, worker=worker,
                evaluator=evaluator, started_at=started_at, traces_hash=traces_hash,
                created_at=T0 + timedelta(minutes=minute) - timedelta(seconds=30),
                finished_at=(finished_at or T0 + timedelta(minutes=minute)) if finished else None,
            ))
        return attempt_id

    def trace(self, attempt_id: str, workload_uuid: str, status: str = "PASSED", *, latency_ms: float | None = None,
              reference_latency_ms: float | None = None, t_sol_ms: float | None = None,
              t_baseline_ms: float | None = None, sol_score: float | None = None,
              intervals: tuple[float, float, float, float] | None = None) -> None:
        """`intervals`: the timed runs' (q1, q3) of the solution, then of the reference."""
        speedup = reference_latency_ms / latency_ms if latency_ms and reference_latency_ms else None
        evaluation: dict = {"status": status, "environment": {"hardware": "cpu"}, "timestamp": "2026-12-01T00:00:00Z"}
        if status in ("PASSED", "INCORRECT_NUMERICAL"):
            evaluation["correctness"] = {"max_absolute_error": 0.0, "max_relative_error": 0.0}
        if status == "PASSED":
            evaluation["performance"] = {"latency_ms": latency_ms, "reference_latency_ms": reference_latency_ms,
                                         "speedup_factor": speedup}
            if intervals:
                q1, q3, rq1, rq3 = intervals
                evaluation["timing"] = {"median_ms": latency_ms, "min_ms": q1, "max_ms": q3, "runs": 20, "q1_ms": q1,
                                        "q3_ms": q3, "reference_q1_ms": rq1, "reference_q3_ms": rq3}
        trace = {"definition": "p", "solution": "s", "workload": {"uuid": workload_uuid, "axes": {}, "inputs": {}},
                 "evaluation": evaluation}
        with self.db.session() as session:
            session.add(TraceRow(attempt_id=attempt_id, workload_uuid=workload_uuid, status=status,
                                 latency_ms=latency_ms, reference_latency_ms=reference_latency_ms, speedup=speedup,
                                 t_sol_ms=t_sol_ms, t_baseline_ms=t_baseline_ms, sol_score=sol_score,
                                 trace_json=json.dumps(trace)))

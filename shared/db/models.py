"""The system of record: problems, solutions, campaigns, assignments, attempts and traces.

Large or binary content (solution sources, logs, traces as JSONL) lives in the object store,
addressed by SHA-256; rows keep the hash.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import Boolean, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint, false
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass


class ProblemRow(Base):
    __tablename__ = "problems"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    op_type: Mapped[str | None] = mapped_column(String(64))
    description: Mapped[str | None] = mapped_column(Text)
    source_path: Mapped[str | None] = mapped_column(Text)
    definition_json: Mapped[str] = mapped_column(Text)
    workloads_jsonl: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class SolutionRow(Base):
    __tablename__ = "solutions"

    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"))
    name: Mapped[str] = mapped_column(String(255))
    author: Mapped[str] = mapped_column(String(255))
    language: Mapped[str] = mapped_column(String(32))
    parent_hash: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class CampaignRow(Base):
    __tablename__ = "campaigns"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    status: Mapped[str] = mapped_column(String(16), default="RUNNING")  # RUNNING, STOPPED
    device: Mapped[str] = mapped_column(String(16), default="cpu")
    writers: Mapped[int] = mapped_column(Integer, default=1)
    attempts_per_assignment: Mapped[int] = mapped_column(Integer, default=4)
    next_index: Mapped[int] = mapped_column(Integer, default=0)  # round-robin cursor
    policy: Mapped[str] = mapped_column(String(32), default="round_robin", server_default="round_robin")
    budget_attempts: Mapped[int | None] = mapped_column(Integer)
    budget_gpu_s: Mapped[float | None] = mapped_column(Float)
    budget_tokens: Mapped[int | None] = mapped_column(Integer)
    budget_wall_s: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    stopped_at: Mapped[datetime | None] = mapped_column()
    # continuous: never stops on its own; a problem whose search is exhausted waits for another writer
    continuous: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    status_reason: Mapped[str | None] = mapped_column(String(255))  # why STOPPED, or why RUNNING and idle


class CampaignProblemRow(Base):
    __tablename__ = "campaign_problems"

    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaigns.id"), primary_key=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"), primary_key=True)
    position: Mapped[int] = mapped_column(Integer)
    best_attempt_id: Mapped[str | None] = mapped_column(ForeignKey("attempts.id"))


class AssignmentRow(Base):
    __tablename__ = "assignments"
    __table_args__ = (
        Index("ix_assignments_campaign_status", "campaign_id", "status"),  # the planner's active count
        Index("ix_assignments_campaign_problem", "campaign_id", "problem_id"),  # a problem's last DONE
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaigns.id"))
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"))
    status: Mapped[str] = mapped_column(String(16), default="QUEUED")  # QUEUED, RUNNING, DONE
    worker: Mapped[str | None] = mapped_column(String(255))
    budget_attempts: Mapped[int] = mapped_column(Integer)
    language: Mapped[str | None] = mapped_column(String(32))
    parent_hash: Mapped[str | None] = mapped_column(String(64))
    guidance: Mapped[str | None] = mapped_column(Text)
    lease_until: Mapped[datetime | None] = mapped_column()  # a RUNNING assignment past it is reassigned
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column()
    tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # an LLM session's, on no attempt
    writer: Mapped[str | None] = mapped_column(String(255))  # who claimed it: "tuner" or "llm:<model>"


class AttemptRow(Base):
    """One evaluation of one solution on a problem's workloads. `status` is PENDING or RUNNING
    until the evaluator finishes, then the attempt's overall status: PASSED only if it ran every
    workload of the problem and all passed; PARTIAL if it ran only some (`workload_uuids`, a
    rung of the tuner's successive halving) and those passed, a figure for ranking candidates on
    those workloads, never a record (nothing that looks for PASSED ranks it)."""

    __tablename__ = "attempts"
    __table_args__ = (
        Index("ix_attempts_problem_status", "problem_id", "status"),
        Index("ix_attempts_campaign_problem", "campaign_id", "problem_id"),
        Index("ix_attempts_status_evaluator", "status", "evaluator"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"))
    solution_hash: Mapped[str] = mapped_column(ForeignKey("solutions.hash"))
    campaign_id: Mapped[int | None] = mapped_column(ForeignKey("campaigns.id"))
    assignment_id: Mapped[int | None] = mapped_column(ForeignKey("assignments.id"))
    status: Mapped[str] = mapped_column(String(32), default="PENDING")
    device: Mapped[str] = mapped_column(String(16))
    hardware: Mapped[str | None] = mapped_column(String(128))
    worker: Mapped[str | None] = mapped_column(String(255))
    evaluator: Mapped[str | None] = mapped_column(String(255))  # the Celery node that holds it while RUNNING
    started_at: Mapped[datetime | None] = mapped_column()  # when that evaluator took it
    # the last sign it is looked after while in flight: its evaluator's heartbeat while RUNNING, the
    # planner's sweep sending it again while PENDING (services/planner/sweep.py)
    seen_at: Mapped[datetime | None] = mapped_column()
    tries: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # evaluations started
    workload_uuids: Mapped[str | None] = mapped_column(Text)  # JSON list: run only these; None: all
    workloads_total: Mapped[int] = mapped_column(Integer, default=0)
    workloads_passed: Mapped[int] = mapped_column(Integer, default=0)
    latency_ms: Mapped[float | None] = mapped_column(Float)  # mean over workloads
    speedup: Mapped[float | None] = mapped_column(Float)  # geomean of reference/latency
    sol_score: Mapped[float | None] = mapped_column(Float)  # mean of the workloads' SOL scores
    model: Mapped[str | None] = mapped_column(String(255))  # the LLM that wrote it, if any
    tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    gpu_seconds: Mapped[float | None] = mapped_column(Float)
    message: Mapped[str | None] = mapped_column(Text)
    traces_hash: Mapped[str | None] = mapped_column(String(64))  # traces JSONL in the store
    # evaluate (a verdict), or a writer's diagnostic tool: profile, inspect (never PASSED, never ranked)
    kind: Mapped[str] = mapped_column(String(16), default="evaluate", server_default="evaluate")
    tool_args: Mapped[str | None] = mapped_column(Text)  # JSON: what a diagnostic tool was asked
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column()


class TraceRow(Base):
    __tablename__ = "traces"
    __table_args__ = (UniqueConstraint("attempt_id", "workload_uuid"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt_id: Mapped[str] = mapped_column(ForeignKey("attempts.id"))
    workload_uuid: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(32))
    latency_ms: Mapped[float | None] = mapped_column(Float)
    reference_latency_ms: Mapped[float | None] = mapped_column(Float)
    speedup: Mapped[float | None] = mapped_column(Float)
    t_sol_ms: Mapped[float | None] = mapped_column(Float)
    t_baseline_ms: Mapped[float | None] = mapped_column(Float)
    sol_score: Mapped[float | None] = mapped_column(Float)
    trace_json: Mapped[str] = mapped_column(Text)


class BaselineRow(Base):
    """T_b per (problem, workload, hardware): the faster of eager and torch.compile on the reference."""

    __tablename__ = "baselines"
    __table_args__ = (UniqueConstraint("problem_id", "workload_uuid", "hardware"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"))
    workload_uuid: Mapped[str] = mapped_column(String(64))
    hardware: Mapped[str] = mapped_column(String(128))
    eager_ms: Mapped[float | None] = mapped_column(Float)
    compile_ms: Mapped[float | None] = mapped_column(Float)
    measured_at: Mapped[datetime] = mapped_column(default=utcnow)


class CalibrationRow(Base):
    """Ceilings an evaluator measured on its GPU: copy bandwidth and matmul rates per dtype."""

    __tablename__ = "calibrations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    hardware: Mapped[str] = mapped_column(String(128))
    bandwidth_gbps: Mapped[float | None] = mapped_column(Float)
    tflops_json: Mapped[str] = mapped_column(Text, default="{}")  # {"bfloat16": 790.0, ...}
    measured_at: Mapped[datetime] = mapped_column(default=utcnow)


class WebKeyRow(Base):
    """A secret the web processes of a deployment share, made once at random by the first one that
    needs it (`session_key`: what signs the session cookie)."""

    __tablename__ = "web_keys"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class WebLoginRow(Base):
    """A browser session logged in with the submit token; logging out deletes it, so an old cookie
    replayed afterwards is refused. The cookie carries the login id; only its SHA-256 is kept here."""

    __tablename__ = "web_logins"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_tag: Mapped[str] = mapped_column(String(64))  # HMAC of the token it logged in with: a new token ends it
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(index=True)


class TokenFailureRow(Base):
    """One wrong submit token from one client address (the web's throttle counts them per window)."""

    __tablename__ = "token_failures"
    __table_args__ = (Index("ix_token_failures_client_at", "client", "failed_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    client: Mapped[str] = mapped_column(String(64))
    failed_at: Mapped[datetime] = mapped_column(index=True)


class NoteRow(Base):
    """One entry a writer appended to a problem's notes (shared/notes.py), kept for good: the
    planner's trimming only changes `shown`, how the entry appears in the current notes file:
    FULL, SHORT (its first line) or DROPPED (only here and on the problem page)."""

    __tablename__ = "notes"
    __table_args__ = (Index("ix_notes_problem_shown", "problem_id", "shown"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"))
    author: Mapped[str] = mapped_column(String(255))  # the model that wrote it
    text: Mapped[str] = mapped_column(Text)
    attempt_id: Mapped[str | None] = mapped_column(ForeignKey("attempts.id"))  # the writer's latest, if any
    shown: Mapped[str] = mapped_column(String(16), default="FULL", server_default="FULL")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class NotesFileRow(Base):
    """A problem's current notes file: Markdown in the object store by its SHA-256, rewritten on
    every append and trim."""

    __tablename__ = "notes_files"

    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"), primary_key=True)
    notes_hash: Mapped[str] = mapped_column(String(64))
    entries: Mapped[int] = mapped_column(Integer)  # shown in the file, in full or shortened
    chars: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    trimmed_at: Mapped[datetime | None] = mapped_column()

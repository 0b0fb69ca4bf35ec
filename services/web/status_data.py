"""What the status page shows: queue depths (Redis), workers that answer a Celery ping, evaluators
busy with an attempt or seen recently in the DB and their faults (Redis, `shared.health`),
throughput, recent errors and the campaigns."""

from __future__ import annotations

import logging
import re
from datetime import datetime, timedelta, timezone

import redis
from celery import Celery
from kombu.exceptions import OperationalError
from pydantic import BaseModel, ConfigDict
from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from shared.celery_app import EVALUATE_QUEUE, PLAN_QUEUE, WRITE_QUEUE, evaluate_queue
from shared.db.models import AttemptRow, CampaignProblemRow, CampaignRow, ProblemRow, utcnow
from shared.leaderboard import IN_FLIGHT, PASSED, as_utc
from shared.endpoints import endpoint_errors
from shared.health import evaluator_faults
from shared.repository import PARTIAL, VERDICT_KIND

log = logging.getLogger(__name__)

PING_TIMEOUT_S = 0.5
RECENT_WORKER_WINDOW = timedelta(minutes=15)
RECENT_ERRORS = 15
MESSAGE_CHARS = 400
ENDPOINT_ERRORS = 10
ROLES = {"planner": "planner", "worker": "writers", "evaluator": "evaluator"}  # `-n <name>@host` prefixes


class QueueDepth(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    depth: int


class OnlineWorker(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str  # Celery's node name, `<service>@<host>`
    role: str  # planner, writers, evaluator or other


class BusyEvaluator(BaseModel):
    """An evaluator that holds a RUNNING attempt, per the DB. An evaluator runs with `--pool solo`:
    while it evaluates it answers no ping, so the ping alone would not list it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str  # Celery's node name, `evaluator@<host>`
    device: str
    attempt_id: str
    problem: str
    started_at: datetime | None


class RecentEvaluator(BaseModel):
    """An evaluator that finished attempts in the last RECENT_WORKER_WINDOW, per the DB."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    worker: str
    device: str
    hardware: str | None
    attempts: int
    last_seen: datetime


class RecentError(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    attempt_id: str
    problem: str
    status: str
    at: datetime
    message: str | None


class CampaignState(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: int
    name: str
    status: str
    device: str
    writers: int
    policy: str
    problems: int
    attempts: int
    created_at: datetime
    status_reason: str | None = None  # why it stopped or paused, or why it runs idle


class Throughput(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    finished_last_hour: int
    passed_last_hour: int
    finished_last_24h: int
    in_flight: int


class SupervisedProcess(BaseModel):
    """A process that `kernelswarm up` started and restarts when it exits (Redis and the Celery workers)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str  # redis, planner, worker or evaluator
    pid: int | None  # None while it waits to be started again
    restarts: int  # since `up` started
    last_exit: str | None  # how it last ended ("was killed by SIGKILL", "exited with code 1")
    crash_loop: bool = False  # restarted more than MAX_RESTARTS times within 10 min: still restarted, backing off


class EvaluatorHealth(BaseModel):
    """An evaluator's faults kept in Redis (`shared.health`): unhealthy while its latest is recent."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    evaluator: str
    unhealthy: bool
    last_hour: int
    last_at: datetime
    last_attempt: str | None
    last_message: str


class EndpointErrorEntry(BaseModel):
    """An error an LLM writer met at its endpoint (`shared.endpoints`): `fatal` ones (a wrong key or
    model, no quota) paused the writer's campaign; the others (rate limits, 5xx) are retried."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    at: datetime
    kind: str
    fatal: bool
    model: str | None
    assignment: int | None
    message: str


class StatusReport(BaseModel):
    """`queues` and `workers_online` are None when they could not be asked (no Redis configured,
    or Redis unreachable: `redis_error` says which). `processes` is None unless the web is served
    by `kernelswarm up` (which supervises them)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    generated_at: datetime
    queues: list[QueueDepth] | None
    workers_online: list[OnlineWorker] | None
    redis_error: str | None
    busy_evaluators: list[BusyEvaluator]
    recent_evaluators: list[RecentEvaluator]
    throughput: Throughput
    recent_errors: list[RecentError]
    campaigns: list[CampaignState]
    processes: list[SupervisedProcess] | None = None
    evaluator_faults: list[EvaluatorHealth] | None = None  # None where Redis could not be asked
    endpoint_errors: list[EndpointErrorEntry] | None = None  # newest first, the latest ENDPOINT_ERRORS; None: not asked
    details_hidden: bool = False  # PIDs and host paths left out: shown to a logged-in user only (`public_view`)


HOST_PATH = re.compile(r"(?<![\w.:/~-])/(?:[\w.@+~-]+/)*[\w.@+~-]+/?")  # an absolute path, not a URL's tail
PID_SUFFIX = re.compile(r"/\d+$")  # an evaluator named `host/pid` (record.py, outside Celery)
HIDDEN_PATH = "<path>"


def hide_paths(text: str | None) -> str | None:
    """`text` with every absolute host path replaced by `<path>`."""
    return HOST_PATH.sub(HIDDEN_PATH, text) if text else text


def public_view(report: StatusReport) -> StatusReport:
    """What a visitor who is not logged in sees: no process ids, no host paths (issue 40, M1)."""
    processes = None if report.processes is None else [p.model_copy(update={"pid": None}) for p in report.processes]
    faults = None if report.evaluator_faults is None else [
        f.model_copy(update={"last_message": hide_paths(f.last_message)}) for f in report.evaluator_faults]
    endpoint = None if report.endpoint_errors is None else [
        e.model_copy(update={"message": hide_paths(e.message)}) for e in report.endpoint_errors]
    return report.model_copy(update={
        "processes": processes, "evaluator_faults": faults, "endpoint_errors": endpoint,
        "redis_error": hide_paths(report.redis_error),
        "busy_evaluators": [b.model_copy(update={"name": PID_SUFFIX.sub("", b.name)}) for b in report.busy_evaluators],
        "recent_evaluators": [r.model_copy(update={"worker": PID_SUFFIX.sub("", r.worker)})
                              for r in report.recent_evaluators],
        "recent_errors": [e.model_copy(update={"message": hide_paths(e.message)}) for e in report.recent_errors],
        "details_hidden": True})


def status_report(session: Session, client: redis.Redis | None, celery: Celery | None,
                  processes: list[SupervisedProcess] | None = None) -> StatusReport:
    campaigns = _campaigns(session)
    names = [PLAN_QUEUE, WRITE_QUEUE, EVALUATE_QUEUE]
    names += sorted({evaluate_queue(c.device) for c in campaigns} - set(names))
    queues, workers, error, faults, endpoint = None, None, None, None, None
    if client is None or celery is None:
        error = "no Redis configured (KERNELSWARM_REDIS_URL)"
    else:
        try:
            queues = queue_depths(client, names)
            faults = [EvaluatorHealth(**f) for f in evaluator_faults(client)]
            endpoint = [EndpointErrorEntry(**{k: e.get(k) for k in EndpointErrorEntry.model_fields})
                        for e in endpoint_errors(client)[:ENDPOINT_ERRORS]]
            workers = online_workers(celery)
        except (redis.RedisError, OperationalError) as failure:
            log.warning("status: redis unreachable error=%r", failure)
            error = f"Redis unreachable: {failure}"
    return StatusReport(
        generated_at=datetime.now(timezone.utc), queues=queues, workers_online=workers, redis_error=error,
        busy_evaluators=_busy_evaluators(session), recent_evaluators=_recent_evaluators(session),
        throughput=_throughput(session), recent_errors=_recent_errors(session), campaigns=campaigns,
        processes=processes, evaluator_faults=faults, endpoint_errors=endpoint,
    )


def queue_depths(client: redis.Redis, names: list[str]) -> list[QueueDepth]:
    """Messages waiting in each queue (Celery's Redis transport keeps a queue as a list)."""
    with client.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.llen(name)
        depths = pipe.execute()
    return [QueueDepth(name=name, depth=int(depth)) for name, depth in zip(names, depths)]


def online_workers(celery: Celery) -> list[OnlineWorker]:
    replies = celery.control.inspect(timeout=PING_TIMEOUT_S).ping() or {}
    return [OnlineWorker(name=name, role=ROLES.get(name.split("@")[0], "other")) for name in sorted(replies)]


def _busy_evaluators(session: Session) -> list[BusyEvaluator]:
    """The RUNNING attempts and the evaluators that hold them (`attempts.evaluator`, set when one
    takes an attempt), oldest first."""
    rows = session.execute(
        select(AttemptRow.evaluator, AttemptRow.device, AttemptRow.id, ProblemRow.name, AttemptRow.started_at)
        .join(ProblemRow, ProblemRow.id == AttemptRow.problem_id)
        .where(AttemptRow.status == "RUNNING", AttemptRow.evaluator.is_not(None))
        .order_by(AttemptRow.started_at, AttemptRow.evaluator)
    ).all()
    return [BusyEvaluator(name=r.evaluator, device=r.device, attempt_id=r.id, problem=r.name,
                          started_at=as_utc(r.started_at)) for r in rows]


def _recent_evaluators(session: Session) -> list[RecentEvaluator]:
    """By `attempts.evaluator`, the node that ran the attempt (`attempts.worker` is the writer's host)."""
    since = utcnow() - RECENT_WORKER_WINDOW
    rows = session.execute(
        select(AttemptRow.evaluator, AttemptRow.device, func.max(AttemptRow.hardware).label("hardware"),
               func.count().label("attempts"), func.max(AttemptRow.finished_at).label("last_seen"))
        .where(AttemptRow.finished_at >= since, AttemptRow.evaluator.is_not(None))
        .group_by(AttemptRow.evaluator, AttemptRow.device).order_by(AttemptRow.evaluator)
    ).all()
    return [RecentEvaluator(worker=r.evaluator, device=r.device, hardware=r.hardware, attempts=r.attempts,
                            last_seen=as_utc(r.last_seen)) for r in rows]


def _throughput(session: Session) -> Throughput:
    now = utcnow()
    hour, day = now - timedelta(hours=1), now - timedelta(hours=24)
    row = session.execute(select(
        func.sum(case((AttemptRow.finished_at >= hour, 1), else_=0)).label("hour"),
        func.sum(case(((AttemptRow.finished_at >= hour) & (AttemptRow.status == PASSED), 1), else_=0)).label("passed"),
        func.count().label("day"),
    ).where(AttemptRow.finished_at >= day, AttemptRow.status.not_in(IN_FLIGHT))).one()
    in_flight = session.scalar(select(func.count()).select_from(AttemptRow).where(AttemptRow.status.in_(IN_FLIGHT)))
    return Throughput(finished_last_hour=int(row.hour or 0), passed_last_hour=int(row.passed or 0),
                      finished_last_24h=int(row.day or 0), in_flight=int(in_flight or 0))


def _recent_errors(session: Session) -> list[RecentError]:
    finished_at = func.coalesce(AttemptRow.finished_at, AttemptRow.created_at)
    rows = session.execute(
        select(AttemptRow.id, ProblemRow.name, AttemptRow.status, finished_at.label("at"), AttemptRow.message)
        .join(ProblemRow, ProblemRow.id == AttemptRow.problem_id)
        .where(AttemptRow.status.not_in((*IN_FLIGHT, PASSED, PARTIAL)), AttemptRow.kind == VERDICT_KIND)
        .order_by(finished_at.desc(), AttemptRow.id.desc()).limit(RECENT_ERRORS)
    ).all()
    return [RecentError(attempt_id=r.id, problem=r.name, status=r.status, at=as_utc(r.at),
                        message=r.message[:MESSAGE_CHARS] if r.message else None) for r in rows]


def _campaigns(session: Session) -> list[CampaignState]:
    problems = (select(CampaignProblemRow.campaign_id, func.count().label("n"))
                .group_by(CampaignProblemRow.campaign_id).subquery())
    attempts = (select(AttemptRow.campaign_id, func.count().label("n"))
                .where(AttemptRow.campaign_id.is_not(None)).group_by(AttemptRow.campaign_id).subquery())
    rows = session.execute(
        select(CampaignRow, func.coalesce(problems.c.n, 0).label("problems"),
               func.coalesce(attempts.c.n, 0).label("attempts"))
        .outerjoin(problems, problems.c.campaign_id == CampaignRow.id)
        .outerjoin(attempts, attempts.c.campaign_id == CampaignRow.id)
        .order_by(CampaignRow.id.desc())
    ).all()
    return [CampaignState(id=c.id, name=c.name, status=c.status, device=c.device, writers=c.writers,
                          policy=c.policy, problems=n_problems, attempts=n_attempts, created_at=as_utc(c.created_at),
                          status_reason=c.status_reason)
            for c, n_problems, n_attempts in rows]

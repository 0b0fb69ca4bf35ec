"""The `plan` tasks and the planner's sweeper. A tick fills idle writer slots; a finished assignment
records the best and ticks; the sweeper (started when the worker is ready) recovers from crashes."""

from __future__ import annotations

import functools

import redis
from celery import Celery
from celery.signals import worker_ready, worker_shutdown

from services.planner.advisor import Advisor
from services.planner.campaign import assignment_done
from services.planner.notes import trim_campaign_notes
from services.planner.policy import PolicyConfig
from services.planner.state import StateCache
from services.planner.sweep import Sweeper
from services.planner.tick import PlannerConfig, tick
from shared.celery_app import ASSIGNMENT_DONE, PLAN_TICK, WRITE, send_evaluate
from shared.errors import RetryableError
from shared.runtime import Runtime

WRITE_BATCH = 1000  # `write` messages per Redis pipeline


def broker_epoch(url: str | None) -> str | None:
    """Redis's run id: a new one means the server restarted (and, without persistence, lost every
    queued message). None for other brokers."""
    if not url or not url.startswith(("redis://", "rediss://")):
        return None
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        return str(client.info("server")["run_id"])
    finally:
        client.close()


def planner_config(app: Celery, runtime: Runtime) -> PlannerConfig:
    """An attempt is given up once its writer stopped waiting (`attempt_wait_s`) and any evaluator
    run of it, one redelivery after the broker's visibility timeout included, has hit the hard
    time limit."""
    hard_limit_s = float(app.conf.task_time_limit or 0)
    visibility_s = float((app.conf.broker_transport_options or {}).get("visibility_timeout", 3600))
    settings = runtime.settings
    advisor = Advisor(settings.model, settings.openai_base_url, settings.openai_api_key) \
        if settings.openai_api_key else None  # campaigns with policy `llm` plan with the default without it
    return PlannerConfig(policy=PolicyConfig(writer=settings.writer),
                         attempt_deadline_s=settings.attempt_wait_s + visibility_s + hard_limit_s,
                         sweep_every_s=settings.sweep_every_s, advisor=advisor)


def register(app: Celery, runtime: Runtime, config: PlannerConfig | None = None) -> None:
    config = config or planner_config(app, runtime)
    cache = StateCache()  # ticks and reports run one at a time (solo pool): no lock needed

    def send_write(assignment_ids) -> None:
        """One `worker.write` per assignment, pipelined: on Redis the batch costs one round trip
        rather than one per message (kombu's `Producer.batch`; a transport without batching sends
        them one by one). Sent after the commit; a batch lost with the planner is sent again by the
        sweep at start-up, and a duplicate is harmless (the claim)."""
        with app.producer_or_acquire() as producer, producer.batch(max_size=WRITE_BATCH):
            for assignment_id in assignment_ids:
                app.send_task(WRITE, args=[assignment_id], producer=producer)

    def send_tick(campaign_id: int) -> None:
        app.send_task(PLAN_TICK, args=[campaign_id])

    @app.task(name=PLAN_TICK, acks_late=True, autoretry_for=(RetryableError,), retry_backoff=True)
    def plan_tick(campaign_id: int) -> list[int]:
        created = tick(runtime.db, campaign_id, send_write, config, cache=cache)
        trim_campaign_notes(runtime, campaign_id)  # what writers appended since: back under the budget
        return created

    @app.task(name=ASSIGNMENT_DONE, acks_late=True, autoretry_for=(RetryableError,), retry_backoff=True)
    def on_assignment_done(assignment_id: int) -> list[int]:
        return assignment_done(runtime.db, assignment_id, send_write, config, cache)

    sweeper = Sweeper(lambda: runtime.db, send_write, send_tick, config, functools.partial(send_evaluate, app),
                      lambda: broker_epoch(app.conf.broker_url))

    @worker_ready.connect(weak=False)
    def start_sweeper(**_) -> None:
        sweeper.start()

    @worker_shutdown.connect(weak=False)
    def stop_sweeper(**_) -> None:
        sweeper.stop()

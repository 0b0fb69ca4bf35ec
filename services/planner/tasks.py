"""The `plan` tasks: a tick fills idle writer slots; a finished assignment records the best and ticks."""

from __future__ import annotations

from celery import Celery

from services.planner.campaign import assignment_done, tick
from shared.celery_app import ASSIGNMENT_DONE, PLAN_TICK, WRITE
from shared.errors import RetryableError
from shared.runtime import Runtime


def register(app: Celery, runtime: Runtime) -> None:
    def send_write(assignment_id: int) -> None:
        app.send_task(WRITE, args=[assignment_id])

    @app.task(name=PLAN_TICK, acks_late=True, autoretry_for=(RetryableError,), retry_backoff=True)
    def plan_tick(campaign_id: int) -> list[int]:
        return tick(runtime.db, campaign_id, send_write)

    @app.task(name=ASSIGNMENT_DONE, acks_late=True, autoretry_for=(RetryableError,), retry_backoff=True)
    def on_assignment_done(assignment_id: int) -> list[int]:
        return assignment_done(runtime.db, assignment_id, send_write)

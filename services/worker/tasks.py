"""The `write` task: run one assignment, then tell the planner it is done."""

from __future__ import annotations

import functools

from celery import Celery

from services.worker.write import assignment_closed, run_assignment
from shared.celery_app import ASSIGNMENT_DONE, WRITE, send_evaluate
from shared.errors import RetryableError
from shared.runtime import Runtime


def register(app: Celery, runtime: Runtime) -> None:
    send = functools.partial(send_evaluate, app)

    @app.task(name=WRITE, acks_late=True, autoretry_for=(RetryableError,), retry_backoff=True,
              max_retries=5)
    def write(assignment_id: int) -> int:
        """Idempotent by assignment id: a duplicate finds the assignment claimed or closed. The
        planner hears of every closed assignment, again if a redelivered task finds it closed."""
        made = run_assignment(runtime, assignment_id, send, runtime.settings.lease_s)
        if assignment_closed(runtime, assignment_id):
            app.send_task(ASSIGNMENT_DONE, args=[assignment_id])
        return made

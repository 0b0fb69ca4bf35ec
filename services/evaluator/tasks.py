"""The `evaluate` task: decode the ids, run the attempt, retry only infrastructure faults."""

from __future__ import annotations

from celery import Celery

from services.evaluator.record import evaluate_attempt
from shared.celery_app import EVALUATE
from shared.errors import RetryableError
from shared.runtime import Runtime


def register(app: Celery, runtime: Runtime) -> None:
    @app.task(name=EVALUATE, acks_late=True, autoretry_for=(RetryableError,), retry_backoff=True,
              max_retries=5)
    def evaluate(attempt_id: str, device: str = "cpu") -> str:
        return evaluate_attempt(runtime, attempt_id, device)

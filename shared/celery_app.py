"""The one Celery app every service uses, its queues and the task names that cross services.

Services send each other work by task name (`send_task`), so no service imports another's code.
Queue payloads carry ids and hashes only; the DB row exists before its task is sent.
"""

from __future__ import annotations

from celery import Celery
from kombu import Queue

from shared.settings import Settings

PLAN_QUEUE = "plan"
WRITE_QUEUE = "write"
EVALUATE_QUEUE = "evaluate"

PLAN_TICK = "planner.tick"
ASSIGNMENT_DONE = "planner.assignment_done"
WRITE = "worker.write"
EVALUATE = "evaluator.evaluate"

ROUTES = {
    PLAN_TICK: {"queue": PLAN_QUEUE},
    ASSIGNMENT_DONE: {"queue": PLAN_QUEUE},
    WRITE: {"queue": WRITE_QUEUE},
    EVALUATE: {"queue": EVALUATE_QUEUE},
}


def evaluate_queue(device: str) -> str:
    """`evaluate` for the CPU; `evaluate.<kind>` lets GPU kinds have queues of their own later."""
    return EVALUATE_QUEUE if device == "cpu" else f"{EVALUATE_QUEUE}.{device}"


def send_evaluate(app: Celery, attempt_id: str, device: str) -> None:
    """`evaluator.evaluate` for one attempt, on its device's queue (writers, the web form, the
    planner's sweep and an evaluator back from a crash all send it so)."""
    app.send_task(EVALUATE, args=[attempt_id, device], queue=evaluate_queue(device))


def make_celery(settings: Settings, name: str = "kernelswarm") -> Celery:
    app = Celery(name, broker=settings.broker_url)
    hard_limit_s = settings.attempt_timeout_s + max(settings.attempt_timeout_s, settings.reference_timeout_s) + 60
    app.conf.update(
        task_queues=[Queue(PLAN_QUEUE), Queue(WRITE_QUEUE), Queue(EVALUATE_QUEUE)],
        task_routes=ROUTES,
        task_default_queue=PLAN_QUEUE,
        task_acks_late=True,
        task_reject_on_worker_lost=False,  # a kernel that kills its worker is not redelivered forever
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        task_time_limit=hard_limit_s,
        broker_transport_options={"visibility_timeout": int(hard_limit_s * 2)},
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_send_task_events=True,
        task_send_sent_event=True,
    )
    return app

"""The `evaluate` task: decode the ids, run the attempt, retry only infrastructure faults (each one
recorded for `/status`: `shared.health`; after the last retry the attempt is NOT_EVALUATED). At
start-up a GPU evaluator makes its CUDA context ahead (`evaluate.warm_up`), calibrates its ceilings
when none recent is stored (`calibrate.ensure`), then sends again what it was running when it
last stopped (`record.recover`)."""

from __future__ import annotations

import functools
import logging

import redis
from celery import Celery
from celery.signals import worker_ready

from services.evaluator import calibrate, machine, score
from services.evaluator.sandbox import hidden
from services.evaluator.evaluate import environment, warm_up
from services.evaluator.record import evaluate_attempt, give_up, recover
from shared.celery_app import EVALUATE, send_evaluate
from shared.errors import RetryableError
from shared.health import record_fault
from shared.runtime import Runtime
from shared.sol_bounded import CountLimits

log = logging.getLogger(__name__)


def apply_settings(settings) -> None:
    """What the service's process takes from its settings beyond each attempt's config: the limits
    T_sol's counting child runs under (sol_count_memory_mb, sol_count_time_s), and the swarm's data
    (home, DB, store, logs) its sandboxed children must not see (`sandbox.hidden`)."""
    score.use_count_limits(CountLimits.from_settings(settings))
    hidden.hide(hidden.swarm_data(settings))


def register(app: Celery, runtime: Runtime) -> None:
    stale_after_s = float(app.conf.task_time_limit or 0) or None
    apply_settings(runtime.settings)
    machine.lift_soft_limits()  # a candidate is promised more than a soft limit the machine started with
    faults = redis.Redis.from_url(runtime.settings.redis_url, socket_timeout=2) if runtime.settings.redis_url else None

    @app.task(name=EVALUATE, bind=True, acks_late=True, autoretry_for=(RetryableError,), retry_backoff=True,
              max_retries=5, shared=False)  # bound to this runtime: not added to every other Celery app
    def evaluate(self, attempt_id: str, device: str = "cpu") -> str:
        try:
            return evaluate_attempt(runtime, attempt_id, device, self.request.hostname, stale_after_s)
        except RetryableError as error:  # no verdict: retried with backoff, shown on /status
            log.warning("attempt=%s evaluator fault (try %d of %d): %s", attempt_id, self.request.retries + 1,
                        self.max_retries + 1, error)
            if faults is not None:
                record_fault(faults, self.request.hostname or "evaluator", attempt_id, error)
            if self.request.retries >= self.max_retries:
                give_up(runtime, attempt_id, error, self.request.retries + 1)
            raise

    @worker_ready.connect(weak=False)
    def recover_on_start(sender=None, **_) -> None:
        device = runtime.settings.device
        if device.startswith("cuda"):
            try:
                warm_up(device)
            except Exception:  # the first attempt then pays for it
                log.exception("could not warm up evaluator %s on %s", sender.hostname, device)
        if runtime.settings.calibrate:
            try:  # before the first attempt: the measurement needs the GPU to itself
                calibrate.ensure(runtime.db, device, environment(device).hardware)
            except Exception:  # the DB is down: T_sol stays on the datasheet ceilings until the next start
                log.exception("could not calibrate evaluator %s", sender.hostname)
        try:
            recover(runtime, sender.hostname, functools.partial(send_evaluate, app))
        except Exception:  # the DB or the broker is down: the planner's deadline is the fallback
            log.exception("could not send again the attempts left running by evaluator %s", sender.hostname)

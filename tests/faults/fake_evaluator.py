"""A fast stand-in for the evaluator worker, for the planner's crash test:

    celery -A fake_evaluator worker -Q evaluate --pool threads -c 4

It takes `evaluator.evaluate` like the real one (idempotent by attempt id) and, after a short sleep,
records a PASSED verdict with a speedup drawn from the solution hash, so a campaign moves in seconds
without building or timing anything.
"""

from __future__ import annotations

import hashlib
import time

from shared.celery_app import EVALUATE, make_celery
from shared.db import AttemptRow, utcnow
from shared.logs import configure_logging
from shared.repository import IN_FLIGHT
from shared.runtime import Runtime
from shared.settings import Settings

EVALUATION_S = 0.1

settings = Settings.from_env()
configure_logging(settings.log_level)
app = make_celery(settings, "fake-evaluator")
runtime = Runtime(settings)


@app.task(name=EVALUATE, acks_late=True)
def evaluate(attempt_id: str, device: str = "cpu") -> str:
    with runtime.db.session() as session:
        attempt = session.get(AttemptRow, attempt_id)
        if attempt is None or attempt.status not in IN_FLIGHT:
            return attempt.status if attempt else "UNKNOWN"
        solution_hash = attempt.solution_hash
    time.sleep(EVALUATION_S)
    draw = int(hashlib.sha256(solution_hash.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    with runtime.db.session() as session:
        attempt = session.get(AttemptRow, attempt_id)
        attempt.status, attempt.workloads_total, attempt.workloads_passed = "PASSED", 1, 1
        attempt.speedup, attempt.latency_ms = 0.8 + 2.0 * draw, 1.0 / (0.8 + 2.0 * draw)
        attempt.gpu_seconds, attempt.finished_at = EVALUATION_S, utcnow()
    return "PASSED"

"""LLM endpoint errors, where `kernelswarm up` and `/status` show them at once.

A writer that meets one (`shared.errors.EndpointError`: a wrong key, an unknown model, no quota,
a refused request; `EndpointUnavailable`: a rate limit, a 5xx, no connection, a timeout) pushes it
onto one Redis list, the latest `KEPT` kept for a day: Redis, because every process of a swarm
already reaches it (the Celery broker) and the writer, `up` and the web run in different
processes, often on different hosts. A fatal one also pauses the writer's campaign with the error
as its reason (the DB, `llm_writer.py`), so that no write is sent to an endpoint that cannot take
it until a person has changed the setting and resumed the campaign.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from typing import Any

import redis

from shared.errors import EndpointError
from shared.health import push_capped

log = logging.getLogger(__name__)

KEY = "kernelswarm:endpoint-errors"
KEPT = 50
TTL_S = 24 * 3600
MESSAGE_CHARS = 600


def record_endpoint_error(client: redis.Redis, error: Exception, model: str, assignment_id: int | None = None,
                          now: datetime | None = None) -> None:
    """Best effort: a Redis that is down is logged, never raised (the writer's own error goes on)."""
    entry = {"at": (now or datetime.now(timezone.utc)).isoformat(), "kind": getattr(error, "kind", "unknown"),
             "fatal": isinstance(error, EndpointError), "model": model, "assignment": assignment_id,
             "message": str(error)[:MESSAGE_CHARS]}
    try:
        push_capped(client, KEY, entry, KEPT, TTL_S)
    except redis.RedisError as failure:
        log.warning("could not record the LLM endpoint error %r: %r", error, failure)


def endpoint_errors(client: redis.Redis, since: datetime | None = None) -> list[dict[str, Any]]:
    """Newest first, those at or after `since` when given; `at` as a datetime. Raises
    `redis.RedisError` where Redis is unreachable."""
    found = []
    for raw in client.lrange(KEY, 0, KEPT - 1):
        try:
            entry = json.loads(raw)
            entry["at"] = datetime.fromisoformat(entry["at"])
        except (ValueError, KeyError, TypeError):
            continue  # not one of ours
        if since is None or entry["at"] >= since:
            found.append(entry)
    return found

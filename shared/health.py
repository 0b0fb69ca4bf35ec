"""Evaluators' faults, where `/status` shows them (DESIGN.md: faults are not verdicts, they are
retried and shown). Each fault an evaluator meets (`RetryableError`: its machine refused its own
I/O, a lost checker, a CUDA context not made, the store or the DB down) is pushed onto a Redis list
of its own, named after its Celery node; the latest `KEPT` are kept for a day. An evaluator is
unhealthy while its latest fault is under `UNHEALTHY_AFTER` old."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta, timezone
from typing import Any

import redis

log = logging.getLogger(__name__)

PREFIX = "kernelswarm:evaluator-faults:"
KEPT = 20
TTL_S = 24 * 3600
UNHEALTHY_AFTER = timedelta(minutes=15)
MESSAGE_CHARS = 400


def record_fault(client: redis.Redis, evaluator: str, attempt_id: str, error: BaseException,
                 now: datetime | None = None) -> None:
    """Best effort: a Redis that is down itself is logged, never raised (the retry goes on)."""
    entry = {"at": (now or datetime.now(timezone.utc)).isoformat(), "attempt": attempt_id,
             "kind": type(error).__name__, "message": str(error)[:MESSAGE_CHARS]}
    try:
        push_capped(client, PREFIX + evaluator, entry, KEPT, TTL_S)
    except redis.RedisError as failure:
        log.warning("could not record evaluator %s's fault on attempt %s: %r", evaluator, attempt_id, failure)


def push_capped(client: redis.Redis, key: str, entry: dict[str, Any], kept: int, ttl_s: int) -> None:
    """`entry` first in the list at `key`, which keeps the latest `kept` and expires `ttl_s` after
    the last push: one transaction."""
    with client.pipeline(transaction=True) as pipe:
        pipe.lpush(key, json.dumps(entry))
        pipe.ltrim(key, 0, kept - 1)
        pipe.expire(key, ttl_s)
        pipe.execute()


def evaluator_faults(client: redis.Redis, now: datetime | None = None) -> list[dict[str, Any]]:
    """Per evaluator with faults kept: its name, faults in the last hour, the latest one, and whether
    it is unhealthy now. Sorted by name. Raises `redis.RedisError` where Redis is unreachable."""
    now = now or datetime.now(timezone.utc)
    found = []
    for key in sorted(client.scan_iter(match=PREFIX + "*", count=100)):
        entries = []
        for raw in client.lrange(key, 0, KEPT - 1):
            try:
                entry = json.loads(raw)
                entry["at"] = datetime.fromisoformat(entry["at"])
                entries.append(entry)
            except (ValueError, KeyError, TypeError):
                continue  # not one of ours
        if not entries:
            continue
        latest = max(entries, key=lambda e: e["at"])
        name = key.decode() if isinstance(key, bytes) else key
        found.append({"evaluator": name[len(PREFIX):], "last_hour": sum(now - e["at"] <= timedelta(hours=1)
                                                                          for e in entries),
                      "last_at": latest["at"], "last_attempt": latest.get("attempt"),
                      "last_message": f"{latest.get('kind', 'fault')}: {latest.get('message', '')}",
                      "unhealthy": now - latest["at"] < UNHEALTHY_AFTER})
    return found

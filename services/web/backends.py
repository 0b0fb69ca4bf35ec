"""What the web app talks to besides the DB, opened on first use and kept on `app.extensions`: the
object store, the Celery app (to send tasks by name) and a Redis client (queue depths). Celery and
Redis exist only when `KERNELSWARM_REDIS_URL` is set."""

from __future__ import annotations

import threading
from collections import OrderedDict

import redis
from celery import Celery
from flask import Flask, current_app

from shared.celery_app import make_celery
from shared.settings import Settings
from shared.store import ObjectStore, open_store

EXTENSION = "kernelswarm.backends"
REDIS_TIMEOUT_S = 0.5
KEPT_OBJECT_BYTES = 32 * 1024 * 1024  # store objects kept in memory (they never change: content-addressed)


class Backends:
    def __init__(self, settings: Settings, store: ObjectStore | None = None) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._store = store
        self._celery: Celery | None = None
        self._redis: redis.Redis | None = None
        self._kept: OrderedDict[str, bytes] = OrderedDict()
        self._kept_bytes = 0

    @property
    def store(self) -> ObjectStore:
        with self._lock:
            if self._store is None:
                self._store = open_store(self.settings)
            return self._store

    def get_object(self, digest: str) -> bytes:
        """The store's object, from memory when read lately (least recently read ones go first)."""
        with self._lock:
            data = self._kept.get(digest)
            if data is not None:
                self._kept.move_to_end(digest)
                return data
        data = self.store.get(digest)
        if len(data) <= KEPT_OBJECT_BYTES // 8:
            with self._lock:
                if digest not in self._kept:
                    self._kept[digest] = data
                    self._kept_bytes += len(data)
                while self._kept_bytes > KEPT_OBJECT_BYTES:
                    _, dropped = self._kept.popitem(last=False)
                    self._kept_bytes -= len(dropped)
        return data

    @property
    def celery(self) -> Celery | None:
        if not self.settings.redis_url:
            return None
        with self._lock:
            if self._celery is None:
                self._celery = make_celery(self.settings, name="kernelswarm-web")
            return self._celery

    @property
    def redis(self) -> redis.Redis | None:
        if not self.settings.redis_url:
            return None
        with self._lock:
            if self._redis is None:
                self._redis = redis.Redis.from_url(self.settings.redis_url, socket_timeout=REDIS_TIMEOUT_S,
                                                   socket_connect_timeout=REDIS_TIMEOUT_S)
            return self._redis

    def close(self) -> None:
        with self._lock:
            if self._redis is not None:
                self._redis.close()
            if self._celery is not None:
                self._celery.close()


def init_app(app: Flask, settings: Settings, store: ObjectStore | None = None) -> None:
    app.extensions[EXTENSION] = Backends(settings, store)


def get_backends() -> Backends:
    return current_app.extensions[EXTENSION]


def get_settings() -> Settings:
    return current_app.config["KERNELSWARM_SETTINGS"]

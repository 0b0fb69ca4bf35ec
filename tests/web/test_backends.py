"""services.web.backends: store objects are read once, kept in memory within a byte budget."""

from __future__ import annotations

import pytest

from services.web import backends
from services.web.backends import Backends
from shared.errors import NotFoundError
from shared.settings import Settings
from shared.store import LocalStore


class CountingStore(LocalStore):
    def __init__(self, root) -> None:
        super().__init__(root)
        self.reads = 0

    def get(self, digest: str) -> bytes:
        self.reads += 1
        return super().get(digest)


def test_objects_are_read_once_and_the_oldest_go_first(tmp_path, monkeypatch):
    monkeypatch.setattr(backends, "KEPT_OBJECT_BYTES", 80)
    store = CountingStore(tmp_path)
    kept = Backends(Settings(home=tmp_path), store)
    digests = [store.put(bytes([i]) * 10) for i in range(9)]

    assert kept.get_object(digests[0]) == kept.get_object(digests[0]) == b"\x00" * 10
    assert store.reads == 1
    for digest in digests[1:]:  # 90 bytes in all: the least recently read one goes
        kept.get_object(digest)
    assert store.reads == 9
    kept.get_object(digests[8])
    assert store.reads == 9
    kept.get_object(digests[0])
    assert store.reads == 10

    big = store.put(b"x" * 11)  # over an eighth of the budget: read every time, never kept
    kept.get_object(big), kept.get_object(big)
    assert store.reads == 12
    with pytest.raises(NotFoundError):
        kept.get_object("0" * 64)


def test_without_redis_there_is_no_celery_or_redis(tmp_path):
    kept = Backends(Settings(home=tmp_path))
    assert kept.celery is None and kept.redis is None
    kept.close()

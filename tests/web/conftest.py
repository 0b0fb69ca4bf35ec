"""A migrated SQLite DB per test, a local object store, a private redis-server when asked, and
test clients of the app on them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from webseed import Seed

from kernelswarm.launcher import RedisServer
from services.web import backends, create_app
from shared.db.session import Database
from shared.settings import Settings
from shared.store import LocalStore


@pytest.fixture
def db(tmp_path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path}/t.db")
    yield database
    database.dispose()


@pytest.fixture
def store(tmp_path) -> LocalStore:
    return LocalStore(tmp_path / "store")


@pytest.fixture
def seed(db: Database, store: LocalStore) -> Seed:
    return Seed(db, store)


@pytest.fixture
def redis_url(tmp_path) -> Iterator[str]:
    server = RedisServer(tmp_path / "redis")
    yield server.url
    server.stop()


@pytest.fixture
def make_client(db, store, tmp_path):
    """`make_client(**settings)`: a test client of an app on the test's DB and store; what the app
    opened (Redis and Celery connections) is closed after the test."""
    apps = []

    def make(**settings):
        app = create_app(Settings(home=tmp_path, **settings), db, store)
        app.config["TESTING"] = True
        apps.append(app)
        return app.test_client()

    yield make
    for app in apps:
        app.extensions[backends.EXTENSION].close()


@pytest.fixture
def client(make_client):
    return make_client()

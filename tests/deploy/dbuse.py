"""Which tests use a database: a test does if, while it runs, it or a process it started makes a
SQLite engine or checks out one of its connections, or starts processes with a database's settings.
The SQLite pass of `make test` records them (`--db-tests-out`); the PostgreSQL pass runs those
(`--db-tests-only`): the others cannot see which database is configured.

No pytest in here: child processes import this module too (`childhook.py`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType

# The environment of the test process (and so of its children) while recording: the file children
# append to, and the test running when they were started.
LOG_VAR = "KS_TEST_DB_LOG"
NODEID_VAR = "KS_TEST_NODEID"


def record_engines(session: ModuleType, record: Callable[[], None]) -> None:
    """Wrap `shared.db.session.make_engine`: for a SQLite URL (what the PostgreSQL pass changes),
    `record()` when the engine is made and whenever one of its connections is checked out (an engine
    made before a test ran is used by that test too)."""
    from sqlalchemy import event

    original = session.make_engine
    if getattr(original, "record", None) is not None:
        return

    def make_engine(url: str, **options):
        engine = original(url, **options)
        if url.startswith("sqlite"):
            record()
            event.listen(engine, "checkout", lambda *args: record())
        return engine

    make_engine.record = record
    make_engine.__wrapped__ = original
    session.make_engine = make_engine


def record_settings_env(launcher: ModuleType, record: Callable[[], None]) -> None:
    """Wrap `kernelswarm.launcher.settings_env`: a test that starts processes with the settings of a
    database uses it, even where those processes cannot record (a PYTHONPATH of their own)."""
    original = launcher.settings_env
    if getattr(original, "record", None) is not None:
        return

    def settings_env(settings):
        record()
        return original(settings)

    settings_env.record = record
    settings_env.__wrapped__ = original
    launcher.settings_env = settings_env


class ChildLog:
    """In a child process: append the test id from the environment to the log, once."""

    def __init__(self, path: str, nodeid: str) -> None:
        self.path, self.nodeid, self.done = path, nodeid, False

    def record(self) -> None:
        if self.done or not self.nodeid:
            return
        with open(self.path, "a", encoding="utf-8") as log:  # one short append: whole lines
            log.write(self.nodeid + "\n")
        self.done = True


def child_log(environ: dict[str, str] | None = None) -> ChildLog | None:
    environ = os.environ if environ is None else environ
    path = environ.get(LOG_VAR)
    return ChildLog(path, environ.get(NODEID_VAR, "")) if path else None

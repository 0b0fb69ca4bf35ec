"""The database the whole suite runs on: SQLite (default) or PostgreSQL.

`KERNELSWARM_TEST_DATABASE=postgresql pytest` runs the tests against a real PostgreSQL server
(Debian's package) that this file starts once for the session on a free loopback port, in a temp
folder (tests/deploy/pgtest.py). Tests need no change: they keep building SQLite URLs
(`Database(f"sqlite:///{tmp_path}/x.db")`, `Settings(home=tmp_path).db_url`) and each distinct
SQLite file gets a fresh PostgreSQL database.

How, in the PostgreSQL pass:
- `shared.db.session.make_engine`, through which every engine is made (`Database`, `migrate`,
  the Alembic environment), maps a SQLite *file* URL to its database (created on first use,
  named after the file's absolute path) and touches the file as a stand-in, never opened, since
  opening a SQLite URL creates its file. Other URLs pass unchanged: `sqlite://` in memory, a
  path that is a directory (tests of an unreachable DB), a URL that already names PostgreSQL.
  `Database.url` and `Settings.db_url` keep their SQLite values.
- Child processes: this file prepends tests/deploy/site to PYTHONPATH and sets
  KS_TEST_POSTGRES_URL, so that the `sitecustomize` there makes the same redirect in any Python
  process the tests start (the `kernelswarm` CLI, Celery workers, their children). Children started
  with `kernelswarm.launcher.settings_env(settings)` also get KERNELSWARM_DATABASE_URL set to the
  database, for tests that replace PYTHONPATH; that wrapper is installed before collection, since
  test modules import the function by name.
- KERNELSWARM_TEST_DATABASE itself is removed from the environment at start: `Settings.from_env`
  refuses KERNELSWARM_ names it does not know.
- psycopg warns (ResourceWarning) when a pooled connection is garbage-collected unclosed, where
  sqlite3 is silent; that one warning is ignored, as the SQLite pass cannot see such leaks either.

In the SQLite pass a test opens each new database already migrated, a copy of one migrated once a
session (tests/deploy/migrated.py); the tests of the migrations themselves carry the
`fresh_migrations` marker, which turns the copy off: every migration runs on each new file they open.

A test that only makes sense on SQLite (it reads the SQLite file itself) carries the `sqlite_only`
marker, or is listed in SQLITE_ONLY below for files this one does not own; the PostgreSQL pass
skips it with the reason shown.

Which tests use a database (tests/deploy/dbuse.py): `--db-tests-out FILE` writes the ids of the
tests that made an engine or checked out a connection, themselves or in a process they started;
`--db-tests-only FILE` runs only those, and imports only the files they are in. `make test` records
them in its SQLite pass and runs them in its PostgreSQL pass: the other tests cannot tell which
database is configured, and ran once.
A test whose database use is incidental, the same queries as tests that are listed (`up`'s campaign
and progress, say, in a test of its console or its supervision), carries the `database_agnostic`
marker with the reason: it is not recorded, and runs in the SQLite pass only.
Write these options as `--db-tests-out=FILE`: with a space, pytest takes FILE for a test path
before it has read this file, and fails.
`KERNELSWARM_TEST_DATABASE=postgresql pytest` alone runs everything on PostgreSQL.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parent / "deploy"
if str(DEPLOY) not in sys.path:
    sys.path.insert(0, str(DEPLOY))

import dbuse  # noqa: E402  (tests/deploy, put on the path just above)
import migrated  # noqa: E402
import pgtest  # noqa: E402

DATABASE_VAR = "KERNELSWARM_TEST_DATABASE"
DATABASES = ("sqlite", "postgresql")
UNCLOSED = ".*was deleted while still open"  # psycopg's ResourceWarning for an unclosed connection
SQLITE_ONLY = {
    "tests/shared/test_db.py::test_sqlite_journal_mode_is_wal": "reads the journal mode of the SQLite file",
}
_database_key = pytest.StashKey[str]()
_db_test_files_key = pytest.StashKey[set[Path]]()


def put_site_on_pythonpath() -> None:
    """Child processes import tests/deploy/site/sitecustomize.py (see the module docstring)."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(pgtest.SITE_DIR) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(pgtest.SITE_DIR), *paths])


class PostgresPass(pgtest.Redirect):
    """The redirect of every SQLite file URL, into a server started on first need."""

    def __init__(self) -> None:
        super().__init__("")
        self.server: pgtest.PostgresServer | None = None

    def install(self) -> None:
        import kernelswarm.launcher
        import shared.db.session

        pgtest.redirect_engines(shared.db.session, self)
        pgtest.redirect_settings_env(kernelswarm.launcher, self)

    def start(self) -> None:
        if self.server is not None:
            return
        self.server = pgtest.PostgresServer()
        self.server_url = self.server.base_url
        os.environ[pgtest.SERVER_URL_VAR] = self.server.base_url
        put_site_on_pythonpath()

    def target(self, url: str) -> str | None:
        self.start()
        return super().target(url)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


class DatabaseUse:
    """The ids of the tests that used a database, in this process and in the ones it started."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.used: set[str] = set()
        self.current = ""
        handle, self.child_log = tempfile.mkstemp(prefix="kernelswarm-db-use-")
        os.close(handle)

    def install(self) -> None:
        import kernelswarm.launcher
        import shared.db.session

        dbuse.record_engines(shared.db.session, self.record)
        dbuse.record_settings_env(kernelswarm.launcher, self.record)
        os.environ[dbuse.LOG_VAR] = self.child_log
        put_site_on_pythonpath()

    def record(self) -> None:
        if self.current:
            self.used.add(self.current)

    def enter(self, nodeid: str) -> None:
        self.current = nodeid
        os.environ[dbuse.NODEID_VAR] = nodeid

    def write(self) -> None:
        children = set(Path(self.child_log).read_text(encoding="utf-8").splitlines())
        Path(self.child_log).unlink()
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_text("".join(f"{nodeid}\n" for nodeid in sorted(self.used | children)))


_postgres: PostgresPass | None = None
_use: DatabaseUse | None = None
_copies: migrated.MigratedCopies | None = None


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kernelswarm database")
    group.addoption("--db-tests-out", type=Path, metavar="FILE",
                    help="write the ids of the tests that used a database (or started a process that did)")
    group.addoption("--db-tests-only", type=Path, metavar="FILE",
                    help="run only the tests listed in FILE (written by --db-tests-out)")


def pytest_configure(config: pytest.Config) -> None:
    global _postgres, _use, _copies
    config.addinivalue_line("markers", "sqlite_only: reads SQLite itself; skipped in the PostgreSQL pass")
    config.addinivalue_line("markers", "database_agnostic(reason): uses a database as tests in the PostgreSQL "
                                       "pass do; left out of that pass")
    config.addinivalue_line("markers", "fresh_migrations: every migration runs on each new database the test "
                                       "opens (no copy of the session's migrated one)")
    database = os.environ.pop(DATABASE_VAR, "sqlite").strip().lower() or "sqlite"
    if database not in DATABASES:
        raise pytest.UsageError(f"{DATABASE_VAR}={database!r}: use one of {', '.join(DATABASES)}")
    config.stash[_database_key] = database
    only = config.getoption("db_tests_only")
    if only is not None and not only.is_file():
        raise pytest.UsageError(f"--db-tests-only {only}: no such file (write it with --db-tests-out)")
    if only is not None:
        config.stash[_db_test_files_key] = {config.rootpath / line.split("::", 1)[0]
                                            for line in only.read_text(encoding="utf-8").splitlines() if line}
    if database == "postgresql":
        # The ini line covers each test's warning filters, the call the session's (garbage
        # collected at the end of the run).
        config.addinivalue_line("filterwarnings", f"ignore:{UNCLOSED}:ResourceWarning")
        warnings.filterwarnings("ignore", message=UNCLOSED, category=ResourceWarning)
        _postgres = PostgresPass()
        _postgres.install()
    out = config.getoption("db_tests_out")
    if out is not None:
        _use = DatabaseUse(out)
        _use.install()
    if database == "sqlite":
        import shared.db.session

        _copies = migrated.MigratedCopies()
        _copies.install(shared.db.session)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _copies is not None:
        _copies.remove()
    if _postgres is not None:
        _postgres.stop()


def pytest_report_header(config: pytest.Config) -> str:
    return f"database: {config.stash[_database_key]} ({DATABASE_VAR})"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With --db-tests-only, a test file that holds none of the tests listed is not imported at all
    (about 5 s of the 15 s that collecting the whole suite takes)."""
    files = config.stash.get(_db_test_files_key, None)
    if files is None or not collection_path.name.startswith("test_") or collection_path.suffix != ".py":
        return None
    return True if collection_path not in files else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    only = config.getoption("db_tests_only")
    if only is not None:
        wanted = set(only.read_text(encoding="utf-8").splitlines())
        kept = [item for item in items if item.nodeid in wanted]
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in wanted])
        items[:] = kept
    if config.stash[_database_key] != "postgresql":
        return
    for item in items:
        reason = SQLITE_ONLY.get(item.nodeid)
        marker = item.get_closest_marker("sqlite_only")
        if reason or marker:
            why = reason or (marker.args[0] if marker.args else "SQLite only")
            item.add_marker(pytest.mark.skip(reason=f"SQLite only: {why}"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if _use is not None and item.get_closest_marker("database_agnostic") is None:
        _use.enter(item.nodeid)
    if _copies is not None:
        _copies.enabled = item.get_closest_marker("fresh_migrations") is None
    try:
        return (yield)
    finally:
        if _use is not None:
            _use.enter("")
        if _copies is not None:
            _copies.enabled = True


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _use is not None:
        _use.write()


@pytest.fixture(scope="session", autouse=True)
def _database_server() -> Iterator[None]:
    """In the PostgreSQL pass, the server is up before any test, so that child processes started
    before the test process opens a database find it too."""
    if _postgres is not None:
        _postgres.start()
    yield


@pytest.fixture(autouse=True)
def _hidden_folders_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """The swarm folders every sandboxed child's view hides (`sandbox.hidden`, process-wide, set by
    the evaluator's `tasks.apply_settings`) are as they were before each test: a test that registers
    the evaluator's tasks leaves no folder of its own in later tests' views."""
    from services.evaluator.sandbox import hidden

    monkeypatch.setattr(hidden, "_hidden", hidden._hidden)

"""A private PostgreSQL server for the tests, and the redirect that puts SQLite file URLs on it.

`PostgresServer` runs Debian's PostgreSQL (`initdb` + `pg_ctl`) in a temporary folder on a free
loopback port; as root it runs as the `postgres` system user, since PostgreSQL refuses root.
`Redirect` gives every distinct SQLite file URL a database of its own on that server, created on
first use, named after the file's absolute path: the test process and the child processes it starts
(Celery workers, the `kernelswarm` command) find the same database for the same file.

No pytest in here: child processes import this module too (`childhook.py`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from types import ModuleType

# Set in the environment of the test process (and so of its children) in the PostgreSQL pass:
# the server's base URL. Not a KERNELSWARM_ name: Settings refuses names it does not know.
SERVER_URL_VAR = "KS_TEST_POSTGRES_URL"
SITE_DIR = Path(__file__).resolve().parent / "site"
DRIVER = "postgresql+psycopg"
START_TIMEOUT_S = 60
SETTINGS = {  # a throwaway cluster: speed over durability
    "fsync": "off", "synchronous_commit": "off", "full_page_writes": "off", "max_connections": "400",
    "listen_addresses": "127.0.0.1",
}


class PostgresError(RuntimeError):
    pass


def bin_dir() -> Path:
    """Where initdb and pg_ctl are: Debian keeps them off PATH, under /usr/lib/postgresql/<major>/bin."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if found:
        return found[-1].parent
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).parent
    raise PostgresError("PostgreSQL not found: install it (`apt-get install postgresql`, or run `make test`)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PostgresServer:
    """`initdb` then `pg_ctl start` in a fresh temp folder; `stop()` removes everything."""

    def __init__(self) -> None:
        self.bin = bin_dir()
        self.as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.root = Path(tempfile.mkdtemp(prefix="kernelswarm-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = 0
        try:
            if self.as_postgres:
                shutil.chown(self.root, "postgres", "postgres")
            self._run("initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-locale",
                      "--no-sync")
            self._start()
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    @property
    def base_url(self) -> str:
        """The server, no database named: what `Redirect` and SERVER_URL_VAR take."""
        return f"{DRIVER}://postgres@127.0.0.1:{self.port}"

    def url(self, database: str = "postgres") -> str:
        return f"{self.base_url}/{database}"

    def _start(self) -> None:
        for _ in range(3):  # the free port may be taken before the server binds it
            self.port = free_port()
            options = " ".join([f"-p {self.port}", f"-k {self.root}",
                                *(f"-c {key}={value}" for key, value in SETTINGS.items())])
            started = self._run("pg_ctl", "-D", self.data, "-l", self.log, "-w", "-t", str(START_TIMEOUT_S),
                                "-o", options, "start", check=False)
            if started.returncode == 0:
                return
        raise PostgresError(f"pg_ctl start failed:\n{started.stdout}\n{self._log_tail()}")

    def _run(self, tool: str, *args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
        ran = subprocess.run([*self.as_postgres, str(self.bin / tool), *map(str, args)], cwd=self.root,
                             capture_output=True, text=True, timeout=START_TIMEOUT_S + 30)
        if check and ran.returncode != 0:
            raise PostgresError(f"{tool} exited with {ran.returncode}:\n{ran.stdout}\n{ran.stderr}")
        return ran

    def _log_tail(self) -> str:
        try:
            return self.log.read_text()[-3000:]
        except OSError:
            return ""

    def stop(self) -> None:
        try:
            if self.port:
                self._run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop", check=False)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def create_database(server_url: str, name: str) -> None:
    """CREATE DATABASE unless it exists, on the server of `server_url` (a database in it is optional);
    safe when several processes race to create it."""
    import psycopg
    from psycopg import errors, sql

    conninfo = server_url.replace(f"{DRIVER}://", "postgresql://", 1)
    with psycopg.connect(conninfo, autocommit=True) as connection:
        if connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            return
        # FILE_COPY (PostgreSQL 15+) copies the small template at once; the default logs it block by block.
        strategy = sql.SQL(" STRATEGY FILE_COPY" if connection.info.server_version >= 150000 else "")
        try:
            connection.execute(sql.SQL("CREATE DATABASE {}{}").format(sql.Identifier(name), strategy))
        except (errors.DuplicateDatabase, errors.UniqueViolation):
            pass  # another process made it first


class Redirect:
    """SQLite file URL -> URL of its own database on the server (created on first use)."""

    def __init__(self, server_url: str) -> None:
        self.server_url = server_url.rstrip("/")  # no database: postgresql+psycopg://user@host:port
        self._created: set[str] = set()

    def target(self, url: str) -> str | None:
        """The PostgreSQL URL standing in for `url`; None for anything but a SQLite file URL (an
        in-memory database, or a path that is a directory, stays as it is)."""
        if not url.startswith("sqlite:///"):
            return None
        raw = url.removeprefix("sqlite:///").split("?", 1)[0]
        if not raw or raw.startswith(":memory:"):
            return None
        path = Path(raw).resolve()
        if path.is_dir():
            return None
        name = "ks_" + hashlib.sha256(str(path).encode()).hexdigest()[:32]
        if name not in self._created:
            create_database(self.server_url, name)
            self._created.add(name)
        # Opening a SQLite URL creates its file; a stand-in keeps that observable (never opened).
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)
        return f"{self.server_url}/{name}"


def redirect_engines(session: ModuleType, redirect: Redirect) -> None:
    """Wrap `shared.db.session.make_engine`: every engine, migrations included, is made through it."""
    original = session.make_engine
    if getattr(original, "redirect", None) is not None:
        return

    def make_engine(url: str, **options):
        return original(redirect.target(url) or url, **options)

    make_engine.redirect = redirect
    make_engine.__wrapped__ = original
    session.make_engine = make_engine


def redirect_settings_env(launcher: ModuleType, redirect: Redirect) -> None:
    """Wrap `kernelswarm.launcher.settings_env`: children started with it get the database URL,
    even those whose PYTHONPATH does not carry `site/` (tests/conftest.py)."""
    original = launcher.settings_env
    if getattr(original, "redirect", None) is not None:
        return

    def settings_env(settings):
        env = original(settings)
        target = redirect.target(settings.db_url)
        if target:
            env["KERNELSWARM_DATABASE_URL"] = target
        return env

    settings_env.redirect = redirect
    settings_env.__wrapped__ = original
    launcher.settings_env = settings_env

"""One run of the migrations per test session: in the SQLite pass, a database a test opens on a new
file starts as a copy of one migrated at the first need.

The migrations on a fresh SQLite file take 0.1 to 0.3 s (some 80 statements, each synced to disk), and
the suite opens about 340 such files. `Database(url)` migrates through `shared.db.session.migrate`; the
wrapper installed here, given a SQLite file URL whose file does not exist yet, first puts a copy of the
template there, then calls the real `migrate`, which finds the newest revision and has nothing to do.
Anything else goes straight to the real `migrate`: other URLs, a file that exists, a direct call of
`shared.db.migrate` (bound before the wrapper), child processes, and the tests that turn the copy off
(the `fresh_migrations` marker, tests/conftest.py), which test the migrations themselves.

Not in the PostgreSQL pass: there CREATE DATABASE, not the migrations, is most of a new database's
cost, and databases made from a migrated template made the pass no faster (measured 2026-12-07).

No pytest in here.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType


def new_sqlite_file(url: str) -> Path | None:
    """The file of a SQLite file URL, where that file does not exist yet; None otherwise."""
    if not url.startswith("sqlite:///") or "?" in url:
        return None
    raw = url.removeprefix("sqlite:///")
    if not raw or raw.startswith(":memory:"):
        return None
    path = Path(raw)
    return None if path.exists() else path


class MigratedCopies:
    """The wrapper of `migrate` and the template it copies, made on first use; `enabled` is switched
    per test."""

    def __init__(self) -> None:
        self.enabled = True
        self.root: Path | None = None  # the template's folder
        self.migrate: Callable[[str], None] | None = None

    def install(self, session: ModuleType) -> None:
        self.migrate = session.migrate

        def migrate(url: str) -> None:
            path = new_sqlite_file(url) if self.enabled else None
            if path is not None:
                self._copy_template(path)
            self.migrate(url)

        migrate.__wrapped__ = self.migrate
        session.migrate = migrate

    def _copy_template(self, path: Path) -> None:
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="kernelswarm-migrated-"))
            self.migrate(f"sqlite:///{self.root / 'template.db'}")
            sqlite3.connect(self.root / "template.db").close()  # the last connection: the WAL folded in, removed
        part = path.with_name(f".{path.name}.{os.getpid()}.part")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.root / "template.db", part)
        except OSError:
            return  # a path no database can be made at: the real migrate fails there as it would have
        try:
            os.link(part, path)  # only where no one made the file meanwhile
        except FileExistsError:
            pass
        finally:
            part.unlink()

    def remove(self) -> None:
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)

"""Engine, sessions and migrations. SQLite by default; a postgresql:// URL works the same."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from shared.home import private_db_file, private_folder

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


def make_engine(url: str, **options) -> Engine:
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        private_folder(path.parent)  # folders made for it: 0700
        private_db_file(path)  # it holds the web's session key: 0600
        engine = create_engine(url, connect_args={"timeout": 30}, **options)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True, **options)


def _sqlite_pragmas(connection, _record) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")  # readers do not block the evaluator's writes
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def migrate(url: str) -> None:
    """Bring the schema to the newest migration (idempotent)."""
    make_engine(url).dispose()  # creates the SQLite folder
    command.upgrade(alembic_config(url), "head")


class Database:
    """An engine plus a session factory; one per process."""

    def __init__(self, url: str, upgrade: bool = True) -> None:
        if upgrade:
            migrate(url)
        self.url = url
        self.engine = make_engine(url)
        self._factory = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A transaction: committed on success, rolled back on any error."""
        session = self._factory()
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def dispose(self) -> None:
        self.engine.dispose()

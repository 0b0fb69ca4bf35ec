"""shared.db: migrations build the schema the models describe; sessions are transactions."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Column, Integer, MetaData, inspect, select, text
from sqlalchemy.exc import IntegrityError

from shared.db import Base, Database, ProblemRow, SolutionRow, migrate
from shared.db.session import alembic_config

pytestmark = pytest.mark.fresh_migrations  # these test the migrations: each database runs them all


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(sqlite_url(tmp_path / "db" / "kernelswarm.db"))
    yield database
    database.dispose()


def schema_diffs(db: Database, metadata: MetaData) -> list:
    """What `alembic revision --autogenerate` would write to go from the migrated DB to `metadata`."""
    with db.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return compare_metadata(context, metadata)


def current_revision(db: Database) -> str | None:
    with db.engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def a_problem(name: str = "add") -> ProblemRow:
    return ProblemRow(name=name, definition_json="{}", workloads_jsonl="")


def problem_names(db: Database) -> list[str]:
    with db.session() as session:
        return list(session.scalars(select(ProblemRow.name).order_by(ProblemRow.name)))


# Migrations.


def test_migrations_build_every_table_on_a_fresh_file(db: Database, tmp_path: Path):
    head = ScriptDirectory.from_config(alembic_config(db.url)).get_current_head()

    assert (tmp_path / "db" / "kernelswarm.db").is_file()
    assert current_revision(db) == head
    assert set(inspect(db.engine).get_table_names()) == set(Base.metadata.tables) | {"alembic_version"}


def test_migrations_are_idempotent(db: Database):
    with db.session() as session:
        session.add(a_problem())
    revision = current_revision(db)

    migrate(db.url)
    again = Database(db.url)

    assert current_revision(again) == revision
    assert problem_names(again) == ["add"]
    again.dispose()


def test_models_match_the_migrations(db: Database):
    """Fails when a model changes without a migration: write one with
    `alembic revision --autogenerate` (see shared/migrations/)."""
    assert schema_diffs(db, Base.metadata) == []


def test_model_drift_is_detected(db: Database):
    """The check above is not vacuous: a column missing from the migrations shows up."""
    drifted = MetaData()
    for table in Base.metadata.tables.values():
        table.to_metadata(drifted)
    drifted.tables["problems"].append_column(Column("added_without_migration", Integer))

    diffs = schema_diffs(db, drifted)

    assert [(d[0], d[2], d[3].name) for d in diffs] == [("add_column", "problems", "added_without_migration")]


# Sessions.


def test_session_commits_on_success(db: Database):
    with db.session() as session:
        session.add(a_problem())

    assert problem_names(db) == ["add"]


def test_session_rolls_back_on_exception(db: Database):
    with db.session() as session:
        session.add(a_problem("kept"))

    with pytest.raises(RuntimeError, match="boom"):
        with db.session() as session:
            session.add(a_problem("dropped"))
            session.flush()  # the row reaches the database inside the transaction
            raise RuntimeError("boom")

    assert problem_names(db) == ["kept"]


def test_session_rolls_back_on_a_database_error(db: Database):
    with pytest.raises(IntegrityError):
        with db.session() as session:
            session.add(a_problem("first"))
            session.add(a_problem("first"))  # name is unique

    assert problem_names(db) == []


def test_foreign_keys_are_enforced(db: Database):
    with pytest.raises(IntegrityError):
        with db.session() as session:
            session.add(SolutionRow(hash="0" * 64, problem_id=12345, name="s", author="a", language="pytorch"))


# SQLite settings.


def test_sqlite_journal_mode_is_wal(db: Database, tmp_path: Path):
    with db.engine.connect() as connection:
        assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
    # WAL is a property of the file: a plain connection that sets no pragma sees it too.
    raw = sqlite3.connect(tmp_path / "db" / "kernelswarm.db")
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        raw.close()

"""shared.db on a real PostgreSQL server (Debian's package, started by the test on a free loopback
port): the migrations build, upgrade and undo the schema the models describe; campaign rows lock
with SELECT ... FOR UPDATE; URLs in the forms the settings document work. Runs in both passes of
`make test`; the PostgreSQL pass runs the rest of the suite on PostgreSQL too (tests/conftest.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, select, text
from sqlalchemy.exc import IntegrityError, OperationalError

from pgtest import PostgresServer, create_database
from services.planner.tick import lock_campaign
from shared.db import Base, CampaignRow, Database, ProblemRow, migrate, utcnow
from shared.db.session import alembic_config

LOCK_WAIT_S = 10.0


@pytest.fixture(scope="module")
def server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    yield server
    server.stop()


@pytest.fixture
def fresh_url(server: PostgresServer, request: pytest.FixtureRequest) -> str:
    """An empty database of its own (named after the test)."""
    name = "t_" + request.node.name.lower()[:50]
    create_database(server.base_url, name)
    return server.url(name)


@pytest.fixture
def db(fresh_url: str) -> Iterator[Database]:
    database = Database(fresh_url)
    yield database
    database.dispose()


def head() -> str:
    return ScriptDirectory.from_config(alembic_config("postgresql://unused")).get_current_head()


def current_revision(db: Database) -> str | None:
    with db.engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def add_campaign(db: Database, name: str = "c") -> int:
    with db.session() as session:
        campaign = CampaignRow(name=name)
        session.add(campaign)
        session.flush()
        return campaign.id


# Migrations.


def test_migrations_build_every_table_on_an_empty_database(db: Database):
    assert db.engine.dialect.name == "postgresql"
    assert current_revision(db) == head()
    assert set(inspect(db.engine).get_table_names()) == set(Base.metadata.tables) | {"alembic_version"}


def test_migrations_are_idempotent_and_keep_rows(db: Database):
    with db.session() as session:
        session.add(ProblemRow(name="add", definition_json="{}", workloads_jsonl=""))

    migrate(db.url)
    again = Database(db.url)

    assert current_revision(again) == head()
    with again.session() as session:
        assert session.scalars(select(ProblemRow.name)).all() == ["add"]
    again.dispose()


def test_models_match_the_migrations(db: Database):
    """Types included: what autogenerate would write against PostgreSQL is nothing."""
    with db.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []


def test_every_migration_downgrades_and_upgrades_again(db: Database):
    """Upgrades are reversible step by step (docs/deploy.md: rolling back an upgrade)."""
    config = alembic_config(db.url)
    revisions = [s.revision for s in ScriptDirectory.from_config(config).walk_revisions()]  # newest first
    for revision in [*revisions[1:], "base"]:
        command.downgrade(config, revision)
        assert current_revision(db) == (None if revision == "base" else revision)
    assert inspect(db.engine).get_table_names() == ["alembic_version"]

    command.upgrade(config, "head")

    assert current_revision(db) == head()
    with db.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []


# Constraints and values.


def test_unique_and_foreign_keys_are_enforced(db: Database):
    with pytest.raises(IntegrityError):
        with db.session() as session:
            session.add(ProblemRow(name="same", definition_json="{}", workloads_jsonl=""))
            session.add(ProblemRow(name="same", definition_json="{}", workloads_jsonl=""))
    with pytest.raises(IntegrityError):
        with db.session() as session:
            session.execute(text("INSERT INTO campaign_problems (campaign_id, problem_id, position) "
                                 "VALUES (12345, 67890, 0)"))


def test_text_and_timestamps_round_trip(db: Database):
    when = utcnow()
    definition = '{"reference": "def run(x):\\n    return x  # ünïcode, emoji 🚀"}' + " " * 100_000
    with db.session() as session:
        session.add(ProblemRow(name="round", definition_json=definition, workloads_jsonl="", created_at=when))
    with db.session() as session:
        row = session.scalars(select(ProblemRow).where(ProblemRow.name == "round")).one()
        assert row.definition_json == definition
        assert row.created_at == when  # naive UTC in, naive UTC out, to the microsecond


# Row locks.


def test_a_locked_campaign_row_refuses_a_second_locker(db: Database):
    campaign_id = add_campaign(db)
    with db.session() as holder:
        lock_campaign(holder, campaign_id)
        with pytest.raises(OperationalError, match="could not obtain lock"):
            with db.session() as other:
                other.scalars(select(CampaignRow).where(CampaignRow.id == campaign_id)
                              .with_for_update(nowait=True)).first()
        with db.session() as reader:  # plain reads are not blocked
            assert reader.get(CampaignRow, campaign_id).name == "c"
    with db.session() as other:  # released at the holder's commit
        assert other.scalars(select(CampaignRow).where(CampaignRow.id == campaign_id)
                             .with_for_update(nowait=True)).first() is not None


def test_concurrent_lockers_wait_and_see_the_committed_row(db: Database):
    """The planner's tick: a second locker waits for the first to commit, then reads its write."""
    campaign_id = add_campaign(db)
    locked, seen = threading.Event(), []

    def second_locker() -> None:
        with db.session() as session:
            campaign = lock_campaign(session, campaign_id)
            seen.append(campaign.next_index)
            locked.set()

    with db.session() as holder:
        campaign = lock_campaign(holder, campaign_id)
        thread = threading.Thread(target=second_locker)
        thread.start()
        assert not locked.wait(0.5), "the second locker did not wait for the row lock"
        campaign.next_index = 7
    assert locked.wait(LOCK_WAIT_S)
    thread.join(LOCK_WAIT_S)
    assert seen == [7]


# URLs.


def test_plain_postgresql_urls_use_psycopg(server: PostgresServer):
    """`postgresql://` (as in .env.example) and `postgresql+psycopg://` open the same database."""
    create_database(server.base_url, "plain_url")
    plain = Database(server.url("plain_url").replace("postgresql+psycopg://", "postgresql://"))
    explicit = Database(server.url("plain_url"))
    try:
        assert plain.engine.dialect.driver == "psycopg"
        add_campaign(plain, "via plain")
        with explicit.session() as session:
            assert session.scalars(select(CampaignRow.name)).all() == ["via plain"]
    finally:
        plain.dispose()
        explicit.dispose()


def test_percent_escapes_in_the_url_reach_the_migrations(server: PostgresServer):
    """A password with '@' and '%' is percent-encoded in the URL; Alembic's config must not
    mangle it (the server trusts loopback, so a mangled URL shows as a wrong user or host)."""
    create_database(server.base_url, "escaped")
    url = server.url("escaped").replace("postgres@", "postgres:p%40ss%25word@")
    database = Database(url)
    try:
        assert current_revision(database) == head()
    finally:
        database.dispose()

"""The machinery of the PostgreSQL pass (tests/conftest.py): SQLite file URLs and their PostgreSQL
databases, in the test process and in the processes it starts, and the record of which tests use
a database."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import dbuse
import pgtest

REPO = Path(__file__).resolve().parents[2]
# A child that opens the database of a SQLite file and adds a problem to it.
CHILD = """
import sys
from shared.db import Database, ProblemRow
db = Database(sys.argv[1])
with db.session() as session:
    session.add(ProblemRow(name="from the child", definition_json="{}", workloads_jsonl=""))
print(db.engine.dialect.name)
"""


@pytest.fixture(scope="module")
def server() -> Iterator[pgtest.PostgresServer]:
    server = pgtest.PostgresServer()
    yield server
    server.stop()


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in (pgtest.SERVER_URL_VAR, dbuse.LOG_VAR, dbuse.NODEID_VAR) and not k.startswith("KERNELSWARM_")}
    paths = [str(pgtest.SITE_DIR), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return env | {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))} | extra


def rows(url: str) -> list[str]:
    with psycopg.connect(url.replace(f"{pgtest.DRIVER}://", "postgresql://", 1)) as connection:
        return [name for (name,) in connection.execute("SELECT name FROM problems")]


def test_a_sqlite_file_gets_a_database_of_its_own(server, tmp_path: Path, monkeypatch):
    redirect = pgtest.Redirect(server.base_url)
    first = redirect.target(f"sqlite:///{tmp_path}/a/one.db")
    monkeypatch.chdir(tmp_path)

    assert first is not None and first.startswith(server.base_url + "/ks_")
    assert redirect.target("sqlite:///a/one.db") == first  # the same file, relative to the cwd
    assert redirect.target(f"sqlite:///{tmp_path}/a/two.db") not in (None, first)
    assert (tmp_path / "a" / "one.db").is_file()  # the stand-in for the file SQLite would create
    with psycopg.connect(first.replace(f"{pgtest.DRIVER}://", "postgresql://", 1)) as connection:
        assert connection.execute("SELECT current_database()").fetchone()[0] == first.rsplit("/", 1)[1]


def test_what_is_not_a_sqlite_file_stays_as_it_is(server, tmp_path: Path):
    redirect = pgtest.Redirect(server.base_url)
    (tmp_path / "adir").mkdir()
    for url in ("sqlite://", "sqlite:///:memory:", f"sqlite:///{tmp_path}/adir", server.url("postgres")):
        assert redirect.target(url) is None, url


def test_a_child_process_finds_the_same_database(server, tmp_path: Path):
    sqlite_url = f"sqlite:///{tmp_path}/shared.db"
    ran = subprocess.run([sys.executable, "-c", CHILD, sqlite_url], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, env=child_env(**{pgtest.SERVER_URL_VAR: server.base_url}))

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["postgresql"]
    assert rows(pgtest.Redirect(server.base_url).target(sqlite_url)) == ["from the child"]


def test_a_child_process_records_that_its_test_used_a_database(tmp_path: Path):
    log = tmp_path / "use.log"
    env = child_env(**{dbuse.LOG_VAR: str(log), dbuse.NODEID_VAR: "tests/x.py::test_y"})
    ran = subprocess.run([sys.executable, "-c", CHILD, f"sqlite:///{tmp_path}/x.db"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env=env)

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["sqlite"]
    assert log.read_text() == "tests/x.py::test_y\n"  # once, however many connections


def test_a_child_without_the_variables_is_left_alone(tmp_path: Path):
    ran = subprocess.run([sys.executable, "-c", "import sys; print('childhook' in sys.modules)"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60, env=child_env())
    assert ran.returncode == 0 and ran.stdout.strip() == "False", ran.stderr

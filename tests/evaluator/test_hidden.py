"""The swarm's own data that no sandboxed child sees (`sandbox.hidden.swarm_data`)."""

from __future__ import annotations

from pathlib import Path

from services.evaluator.sandbox.hidden import PACKAGE_ROOT, swarm_data
from shared.settings import Settings


def test_the_home_and_the_db_and_store_folders_where_settings_put_them(tmp_path: Path) -> None:
    home, db, store = tmp_path / "home", tmp_path / "db" / "k.db", tmp_path / "objects"
    assert swarm_data(Settings(home=home)) == (home.resolve(), (home / "store").resolve())
    elsewhere = Settings(home=home, database_url=f"sqlite:///{db}", store_url=f"file://{store}",
                         scratch_dir=tmp_path / "scratch")
    assert swarm_data(elsewhere) == (home.resolve(), db.parent.resolve(), store.resolve(),
                                     (tmp_path / "scratch").resolve())
    assert swarm_data(Settings(home=home, database_url="postgresql://db/ks", store_url="s3://bucket")) == \
        (home.resolve(),)


def test_a_folder_that_holds_the_code_is_never_covered_its_data_is(tmp_path: Path) -> None:
    """A home at the repository's root (or a DB beside the code): the DB file and the home's known
    entries, not the folder that holds the package the children import."""
    found = swarm_data(Settings(home=PACKAGE_ROOT, database_url=f"sqlite:///{PACKAGE_ROOT / 'ks.db'}"))
    assert PACKAGE_ROOT not in found
    assert {PACKAGE_ROOT / name for name in ("store", "logs", "ks.db", "ks.db-wal")} <= set(found)

"""The swarm's DB kept to its owner without breaking SQLite's locks (shared/home.py)."""

from __future__ import annotations

import sqlite3
import stat
import subprocess
import sys

from shared.home import private_db_file


def test_making_the_db_private_keeps_an_open_connections_view(tmp_path):
    """SQLite's locks are POSIX locks: closing any descriptor of the DB file drops every lock this
    process holds on it. A process that opened and closed the file while its own connection was open
    let another process's last close checkpoint and delete the WAL under it, and from then on it
    read a deleted WAL: `up`'s console and its web site saw no attempt while the evaluator recorded
    them. The control: a new DB file is made 0600."""
    path = tmp_path / "kernelswarm.db"
    private_db_file(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    mine = sqlite3.connect(path)
    mine.execute("PRAGMA journal_mode=WAL")
    mine.execute("CREATE TABLE t (x INTEGER)")
    mine.commit()
    assert mine.execute("SELECT count(*) FROM t").fetchone() == (0,)

    private_db_file(path)  # what every new Database() of this process does

    other = f"import sqlite3; c = sqlite3.connect({str(path)!r}); c.execute('INSERT INTO t VALUES (1)'); c.commit(); c.close()"
    subprocess.run([sys.executable, "-c", other], check=True)
    assert (tmp_path / "kernelswarm.db-wal").exists()  # not deleted under this process's connection
    assert mine.execute("SELECT count(*) FROM t").fetchone() == (1,)
    mine.close()

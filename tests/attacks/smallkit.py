"""Helpers of tests/attacks/test_small.py: a web app on a test DB, many clients at once, the CLI run
in this process."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from flask import Flask

from services.web import backends, create_app
from shared.db import CampaignRow, Database
from shared.settings import Settings
from shared.store import LocalStore

TOKEN = "kTq3v9XzR2mLw8YpN4sHc7JdF6bGa1Ue5oQiVrZt0Ex"  # random, 43 characters (tokens.py refuses weak ones)


def web_app(tmp_path: Path, db: Database, **settings) -> Flask:
    app = create_app(Settings(home=tmp_path, submit_token=TOKEN, **settings), db, LocalStore(tmp_path / "store"))
    app.config["TESTING"] = True
    return app


def close_app(app: Flask) -> None:
    app.extensions[backends.EXTENSION].close()


def a_campaign(db: Database) -> int:
    with db.session() as session:
        row = CampaignRow(name="c", status="RUNNING", device="cpu")
        session.add(row)
        session.flush()
        return row.id


def at_once(count: int, request: Callable[[], int]) -> Counter:
    """`request` made by `count` threads released together; how many got each status code."""
    start, codes, lock = threading.Barrier(count), Counter(), threading.Lock()

    def one() -> None:
        start.wait()
        code = request()
        with lock:
            codes[code] += 1

    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return codes

"""The app's Database, kept on `app.extensions` like any Flask extension."""

from __future__ import annotations

from flask import Flask, current_app

from shared.db.session import Database

EXTENSION = "kernelswarm.db"


def init_app(app: Flask, database: Database) -> None:
    app.extensions[EXTENSION] = database


def get_db() -> Database:
    return current_app.extensions[EXTENSION]

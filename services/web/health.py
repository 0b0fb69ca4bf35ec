"""Liveness for the load balancer and docker compose: a round trip to the DB."""

from __future__ import annotations

import logging

from flask import Blueprint, Response, jsonify
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from services.web.db import get_db

log = logging.getLogger(__name__)

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz() -> tuple[Response, int]:
    try:
        with get_db().session() as session:
            session.execute(text("SELECT 1")).one()
    except SQLAlchemyError as error:
        log.warning("health check failed error=%r", error)
        return jsonify(ok=False, error="database unreachable"), 503
    return jsonify(ok=True), 200

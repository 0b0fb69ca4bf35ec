"""The leaderboard page (`/`) and its JSON (`/api/leaderboard`), both taking `?campaign=<id>`."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, render_template, request

from services.web.db import get_db
from shared.errors import UserError
from shared.leaderboard import Leaderboard, leaderboard, summarize

bp = Blueprint("leaderboard", __name__)

REFRESH_S = 10


@bp.get("/")
def index() -> str:
    board = _load()
    return render_template(
        "leaderboard/index.html", board=board, summary=summarize(board), refresh_s=REFRESH_S
    )


@bp.get("/api/leaderboard")
def api() -> Response:
    return current_app.response_class(_load().model_dump_json(), mimetype="application/json")


def _load() -> Leaderboard:
    campaign_id = parse_campaign(request.args.get("campaign"))
    with get_db().session() as session:
        return leaderboard(session, campaign_id)


def parse_campaign(value: str | None) -> int | None:
    """`?campaign=` absent or empty means every problem; anything else must be a positive integer."""
    if value is None or value == "":
        return None
    if not value.isascii() or not value.isdigit() or int(value) < 1:
        raise UserError(f"campaign must be a positive integer, got {value!r}")
    return int(value)

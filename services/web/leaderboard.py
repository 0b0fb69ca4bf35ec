"""The leaderboard page (`/`) and its JSON (`/api/leaderboard`), both taking `?campaign=<id>`."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, render_template, request
from markupsafe import Markup

from services.web.db import get_db
from services.web.leaderboard_cache import get_cache
from services.web.campaigns import MAX_ID
from shared.errors import UserError
from shared.leaderboard import Leaderboard, LeaderboardEntry

bp = Blueprint("leaderboard", __name__)

REFRESH_S = 10
CELLS_TEMPLATE = "leaderboard/_cells.html"
CELLS_EXTENSION = "kernelswarm.leaderboard_cells"


@bp.get("/")
def index() -> str:
    board = _load()
    op_types = sorted({e.op_type for e in board.problems if e.op_type})
    return render_template("leaderboard/index.html", board=board, summary=board.summary, op_types=op_types,
                           refresh_s=REFRESH_S, cells=_cells(board.problems))


@bp.get("/api/leaderboard")
def api() -> Response:
    return current_app.response_class(_load().model_dump_json(), mimetype="application/json")


def _cells(entries: list[LeaderboardEntry]) -> list[Markup]:
    """Each row's cells, rendered once per distinct entry (entries are frozen: equal entries make
    equal rows) and kept until there are far more kept than shown."""
    kept: dict[tuple[str, LeaderboardEntry], Markup] = current_app.extensions.setdefault(CELLS_EXTENSION, {})
    if len(kept) > 4 * len(entries) + 100:
        kept.clear()
    template = current_app.jinja_env.get_template(CELLS_TEMPLATE)
    prefix = f"{request.script_root}/problems/"
    cells = []
    for entry in entries:
        html = kept.get((prefix, entry))
        if html is None:
            html = kept[prefix, entry] = Markup(template.render(e=entry, problem_prefix=prefix))
        cells.append(html)
    return cells


def _load() -> Leaderboard:
    campaign_id = parse_campaign(request.args.get("campaign"))
    with get_db().session() as session:
        return get_cache().leaderboard(session, campaign_id)


def parse_campaign(value: str | None) -> int | None:
    """`?campaign=` absent or empty means every problem; anything else must be a positive integer."""
    if value is None or value == "":
        return None
    if not value.isascii() or not value.isdigit() or len(value) > 10 or not 1 <= int(value) <= MAX_ID:
        raise UserError(f"campaign must be a positive integer up to {MAX_ID}, got {value[:40]!r}")
    return int(value)

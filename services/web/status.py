"""The status page (`/status`), its JSON, and the campaign controls behind the submit token."""

from __future__ import annotations

from collections.abc import Callable

from flask import Blueprint, Flask, Response, current_app, flash, jsonify, redirect, render_template, request, url_for

from services.web import auth
from services.web.backends import get_backends
from services.web.campaigns import SendTick, control
from services.web.db import get_db
from services.web.status_data import StatusReport, SupervisedProcess, public_view, status_report
from shared.celery_app import PLAN_TICK

bp = Blueprint("status", __name__)

REFRESH_S = 10
PROCESSES = "kernelswarm.processes"


def show_processes(app: Flask, processes: Callable[[], list[SupervisedProcess]]) -> None:
    """Have /status show the processes that `processes()` describes (what `kernelswarm up` supervises)."""
    app.extensions[PROCESSES] = processes


@bp.get("/status")
def index() -> str:
    return render_template("status/index.html", report=_report(), refresh_s=REFRESH_S)


@bp.get("/api/status")
def api() -> Response:
    return current_app.response_class(_report().model_dump_json(), mimetype="application/json")


@bp.post("/status/campaigns/<int:campaign_id>/<action>")
def control_form(campaign_id: int, action: str) -> Response:
    auth.check_csrf(request.form)
    auth.authorize_form(request.form)
    status = control(get_db(), campaign_id, action, _tick_sender())
    flash(f"campaign {campaign_id} is {status}")
    return redirect(url_for("status.index"))


@bp.post("/api/campaigns/<int:campaign_id>/<action>")
def control_api(campaign_id: int, action: str) -> Response:
    auth.require_bearer(request)
    return jsonify(id=campaign_id, status=control(get_db(), campaign_id, action, _tick_sender()))


def _report() -> StatusReport:
    """The whole report for a logged-in user (or an API call with the token); PIDs and host paths
    left out for anyone else."""
    backends = get_backends()
    processes = current_app.extensions.get(PROCESSES)
    with get_db().session() as session:
        report = status_report(session, backends.redis, backends.celery, processes() if processes else None)
    return report if _may_see_details() else public_view(report)


def _may_see_details() -> bool:
    if auth.logged_in():
        return True
    scheme, _, given = (request.headers.get("Authorization") or "").partition(" ")
    return scheme.lower() == "bearer" and auth.token_matches(given.strip())


def _tick_sender() -> SendTick | None:
    celery = get_backends().celery
    if celery is None:
        return None
    return lambda campaign_id: celery.send_task(PLAN_TICK, args=[campaign_id])

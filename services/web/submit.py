"""Submitting a problem: the form (`/submit`) and the API (`POST /api/problems`)."""

from __future__ import annotations

import functools

from flask import Blueprint, Response, jsonify, render_template, request, url_for
from werkzeug.exceptions import RequestEntityTooLarge

from services.web import auth
from services.web.backends import get_backends, get_settings
from services.web.db import get_db
from services.web.submission import (
    DEFINITION,
    MAX_BYTES,
    MAX_REQUEST_BYTES,
    WORKLOADS,
    Accepted,
    SendEvaluate,
    SubmissionError,
    accept,
    validate,
)
from shared.celery_app import send_evaluate

bp = Blueprint("submit", __name__)
REQUEST_LIMIT = f"{MAX_REQUEST_BYTES // 2**20} MiB"  # MAX_REQUEST_BYTES has 64 KiB more, for the form's other fields
FIELD_LIMITS = (f"definition.json at most {MAX_BYTES[DEFINITION] // 1024} KiB, "
                f"workload.jsonl at most {MAX_BYTES[WORKLOADS] // 1024} KiB")


@bp.get("/submit")
def form() -> str:
    return _form({DEFINITION: "", WORKLOADS: ""}, {})


@bp.post("/submit")
def submit() -> str | tuple[str, int] | tuple[str, int, dict[str, str]]:
    auth.check_csrf(request.form)
    texts, errors = _texts_from_form()
    try:
        auth.authorize_form(request.form)
    except auth.TokenRefusedError as error:
        return _form(texts, {**errors, "token": [str(error)]}), error.http_status, error.headers
    if errors:
        return _form(texts, errors), 400
    try:
        accepted = _accept(texts)
    except SubmissionError as error:
        return _form(texts, error.fields), error.http_status
    return render_template("submit/done.html", accepted=accepted)


@bp.post("/api/problems")
def api_submit() -> tuple[Response, int]:
    auth.require_bearer(request)
    try:
        body = request.get_json(silent=True)
    except RecursionError:  # nested deeper than the JSON decoder recurses; silent= covers ValueError only
        body = None
    if not isinstance(body, dict) or not isinstance(body.get(DEFINITION), str) \
            or not isinstance(body.get(WORKLOADS), str):
        return jsonify(error="send JSON {\"definition\": \"<definition.json>\", \"workloads\": \"<workload.jsonl>\"}",
                       status=400), 400
    try:
        accepted = _accept({DEFINITION: body[DEFINITION], WORKLOADS: body[WORKLOADS]})
    except SubmissionError as error:
        return jsonify(error=str(error), status=error.http_status, fields=error.fields), error.http_status
    return jsonify(name=accepted.name, problem_id=accepted.problem_id, workloads=accepted.workloads,
                   attempt_ids=accepted.attempt_ids, campaign_ids=accepted.campaign_ids, queued=accepted.queued,
                   url=url_for("problems.show", name=accepted.name)), 201


@bp.errorhandler(RequestEntityTooLarge)
def too_large(_error: RequestEntityTooLarge) -> tuple[Response | str, int]:
    """A request over MAX_REQUEST_BYTES is refused before it is read (Werkzeug stops at the limit),
    so the form cannot be shown again with its text: say so, and what to do."""
    if request.path.startswith("/api/"):
        return jsonify(error=f"the request is larger than {REQUEST_LIMIT}: {FIELD_LIMITS}", status=413), 413
    return render_template("submit/too_large.html", request_limit=REQUEST_LIMIT, field_limits=FIELD_LIMITS), 413


def _accept(texts: dict[str, str]) -> Accepted:
    settings = get_settings()
    problem = validate(texts[DEFINITION], texts[WORKLOADS], settings.max_workload_bytes)
    return accept(get_db(), get_backends().store, problem, settings.device, _sender(),
                  limit_per_hour=settings.submit_limit_per_hour)


def _sender() -> SendEvaluate | None:
    celery = get_backends().celery
    return None if celery is None else functools.partial(send_evaluate, celery)


def _texts_from_form() -> tuple[dict[str, str], dict[str, list[str]]]:
    """Each field from its uploaded file when one was chosen, else from its text box."""
    texts, errors = {}, {}
    for field in (DEFINITION, WORKLOADS):
        upload = request.files.get(f"{field}_file")
        if upload is None or not upload.filename:
            texts[field] = request.form.get(field, "")
            continue
        data = upload.read(MAX_BYTES[field] + 1)
        if len(data) > MAX_BYTES[field]:
            texts[field], errors[field] = "", [f"{upload.filename}: larger than {MAX_BYTES[field] // 1024} KiB"]
            continue
        try:
            texts[field] = data.decode()
        except UnicodeDecodeError:
            texts[field], errors[field] = "", [f"{upload.filename}: not UTF-8 text"]
    return texts, errors


def _form(texts: dict[str, str], errors: dict[str, list[str]]) -> str:
    return render_template("submit/form.html", texts=texts, errors=errors, max_bytes=MAX_BYTES)

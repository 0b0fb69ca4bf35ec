"""A problem's page (`/problems/<name>`), its JSON, and downloads of solutions and traces.

The DB gives the problem, its attempts and per-workload results (`problem_data`); the object store
gives the best solution's sources and the traces as JSONL, both addressed by hash. The problem's
notes (`shared/notes.py`): the current file from the store, its entries' history from the DB.
"""

from __future__ import annotations

import json

from flask import Blueprint, Response, current_app, render_template

from services.web.backends import get_backends
from services.web.charts import history_svg
from services.web.db import get_db
from services.web.highlight import highlight
from services.web.problem_data import AttemptSummary, ProblemDetail, attempt_detail, problem_detail
from shared.errors import NotFoundError, StoreError
from shared.notes import NoteEntry, NotesFile, note_history, notes_file
from shared.repository import problem_by_name
from shared.schema import Solution, parse_model

bp = Blueprint("problems", __name__)

TRACES_SHOWN_BYTES = 64 * 1024  # the page shows the start of the JSONL; the download has it all
METRIC_LABELS = {"sol_score": "SOL score", "speedup": "speedup over the reference"}
NOTES_HISTORY_SHOWN = 50  # the page's history of note entries; the JSON has every one


@bp.get("/problems/<name>")
def show(name: str) -> str:
    detail = _detail(name)
    solution, solution_note = _best_solution(detail.best)
    traces, traces_note = _best_traces(detail.best)
    notes, notes_note, note_entries, notes_total = _notes(name, NOTES_HISTORY_SHOWN)
    reference = detail.definition.get("reference", "")
    return render_template(
        "problems/show.html", problem=detail, definition=detail.definition,
        reference_html=highlight(reference, "reference.py") if reference else None,
        chart=history_svg(detail.history, METRIC_LABELS[detail.history.metric]),
        metric_label=METRIC_LABELS[detail.history.metric],
        solution=solution, solution_note=solution_note,
        sources_html=[(s.path, highlight(s.content, s.path)) for s in solution.sources] if solution else [],
        traces=traces, traces_note=traces_note,
        notes=notes, notes_note=notes_note, note_entries=note_entries, notes_total=notes_total,
    )


@bp.get("/api/problems/<name>")
def api_show(name: str) -> Response:
    return _json(_detail(name).model_dump_json())


@bp.get("/api/problems/<name>/notes")
def api_notes(name: str) -> Response:
    """The current notes file and every entry written, newest first."""
    notes, notes_note, entries, total = _notes(name, None)
    body = {"problem": name, "notes": notes.text if notes else None, "error": notes_note,
            "entries_shown": notes.entries if notes else 0, "entries_total": total,
            "history": [{"id": e.id, "author": e.author, "created_at": e.created_at.isoformat(),
                         "attempt_id": e.attempt_id, "shown": e.shown, "text": e.text} for e in entries]}
    return _json(json.dumps(body))


@bp.get("/problems/<name>/solution.json")
def best_solution(name: str) -> Response:
    return _solution_download(_require_best(_detail(name)))


@bp.get("/problems/<name>/traces.jsonl")
def best_traces(name: str) -> Response:
    return _traces_download(_require_best(_detail(name)))


@bp.get("/api/attempts/<attempt_id>")
def api_attempt(attempt_id: str) -> Response:
    with get_db().session() as session:
        attempt, problem, per_workload = attempt_detail(session, attempt_id)
    body = {"problem": problem, "attempt": attempt.model_dump(mode="json"),
            "per_workload": [w.model_dump(mode="json") for w in per_workload]}
    return _json(json.dumps(body))


@bp.get("/api/attempts/<attempt_id>/solution.json")
def attempt_solution(attempt_id: str) -> Response:
    return _solution_download(_attempt(attempt_id))


@bp.get("/api/attempts/<attempt_id>/traces.jsonl")
def attempt_traces(attempt_id: str) -> Response:
    return _traces_download(_attempt(attempt_id))


def _detail(name: str) -> ProblemDetail:
    with get_db().session() as session:
        return problem_detail(session, name)


def _attempt(attempt_id: str) -> AttemptSummary:
    with get_db().session() as session:
        return attempt_detail(session, attempt_id)[0]


def _notes(name: str, limit: int | None) -> tuple[NotesFile | None, str | None, list[NoteEntry], int]:
    """The current notes file (None and why when it cannot be read), the newest `limit` entries
    (all when None) and how many there are."""
    with get_db().session() as session:
        problem_id = problem_by_name(session, name).id
        entries, total = note_history(session, problem_id, limit)
        try:
            return notes_file(session, get_backends().get_object, problem_id), None, entries, total
        except (NotFoundError, StoreError) as error:
            return None, f"The notes file cannot be read: {error}", entries, total


def _require_best(detail: ProblemDetail) -> AttemptSummary:
    if detail.best is None:
        raise NotFoundError(f"problem {detail.name!r} has no PASSED attempt yet")
    return detail.best


def _solution(digest: str) -> Solution:
    """As `shared.repository.get_solution`, through the app's memory of store objects."""
    return parse_model(Solution, json.loads(get_backends().get_object(digest)), f"solution {digest}")


def _solution_download(attempt: AttemptSummary) -> Response:
    solution = _solution(attempt.solution_hash)
    response = _json(solution.model_dump_json(indent=2) + "\n")
    response.headers["Content-Disposition"] = f'attachment; filename="{_safe(solution.name)}.json"'
    return response


def _traces_download(attempt: AttemptSummary) -> Response:
    if attempt.traces_hash is None:
        raise NotFoundError(f"attempt {attempt.id} has no traces (status {attempt.status})")
    data = get_backends().get_object(attempt.traces_hash)
    response = current_app.response_class(data, mimetype="application/x-ndjson")
    response.headers["Content-Disposition"] = f'attachment; filename="traces-{attempt.id}.jsonl"'
    return response


def _best_solution(best: AttemptSummary | None) -> tuple[Solution | None, str | None]:
    if best is None:
        return None, "No PASSED attempt yet."
    try:
        return _solution(best.solution_hash), None
    except (NotFoundError, StoreError) as error:
        return None, f"The best solution's sources cannot be read: {error}"


def _best_traces(best: AttemptSummary | None) -> tuple[str | None, str | None]:
    if best is None or best.traces_hash is None:
        return None, "No traces yet."
    try:
        data = get_backends().get_object(best.traces_hash)
    except (NotFoundError, StoreError) as error:
        return None, f"The traces cannot be read: {error}"
    if len(data) <= TRACES_SHOWN_BYTES:
        return data.decode(errors="replace"), None
    shown = data[:TRACES_SHOWN_BYTES].decode(errors="replace")
    return shown, f"The first {TRACES_SHOWN_BYTES // 1024} KiB of {len(data) // 1024} KiB; download them all."


def _json(body: str) -> Response:
    return current_app.response_class(body, mimetype="application/json")


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:120] or "solution"

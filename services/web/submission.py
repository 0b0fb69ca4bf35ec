"""A problem submitted through the web: validated exactly as `kernelswarm problems validate` does
(the files go to a private temp folder and through `load_problem`), plus what a form cannot carry;
then recorded, given to the running campaigns, and its reference sent to the evaluator's sandbox as
a `pytorch` solution so a broken reference shows up as INVALID_REFERENCE.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import tempfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from kombu.exceptions import OperationalError
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from shared.db import CampaignProblemRow, CampaignRow, Database, ProblemRow, utcnow
from shared.errors import FormatError, UserError
from shared.repository import REFERENCE_AUTHOR, create_attempt, put_solution, upsert_problem
from shared.schema import (
    BuildSpec, Hardware, Language, Problem, SafetensorsInput, Solution, SourceFile, load_problem, oversized,
)
from shared.schema.base import child_path
from shared.store import ObjectStore

log = logging.getLogger(__name__)

DEFINITION, WORKLOADS = "definition", "workloads"
FILE_NAMES = {DEFINITION: "definition.json", WORKLOADS: "workload.jsonl"}
MAX_BYTES = {DEFINITION: 256 * 1024, WORKLOADS: 1024 * 1024}
MAX_REQUEST_BYTES = 2 * 1024 * 1024 + 64 * 1024  # both fields at their limits, plus the rest of the form
MAX_WORKLOADS = 1000
MAX_OP_TYPE = 64  # problems.op_type
MAX_UUID = 64  # traces.workload_uuid
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
CAMPAIGNS_TAKING_PROBLEMS = ("RUNNING", "PAUSED")
REFERENCE_FILE = "reference.py"

SendEvaluate = Callable[[str, str], None]  # (attempt id, device); raises kombu's OperationalError


class SubmissionError(UserError):
    """The submission is not valid; `fields` maps a form field to its messages."""

    def __init__(self, fields: dict[str, list[str]]) -> None:
        self.fields = fields
        super().__init__("; ".join(m for messages in fields.values() for m in messages))


@dataclasses.dataclass(frozen=True)
class Accepted:
    name: str
    problem_id: int
    workloads: int
    attempt_ids: list[str]
    campaign_ids: list[int]
    queued: bool  # the reference check was sent to the evaluate queue


def validate(definition_text: str, workloads_text: str, max_workload_bytes: int | None = None) -> Problem:
    """The problem, or a SubmissionError naming the field of every mistake. With `max_workload_bytes`,
    a workload whose tensors take more is one (`schema.oversized`)."""
    texts = {DEFINITION: definition_text, WORKLOADS: workloads_text}
    errors: dict[str, list[str]] = {}
    for field, text in texts.items():
        message = _text_error(text, field)
        if message:
            errors.setdefault(field, []).append(message)
    if errors:
        raise SubmissionError(errors)
    with tempfile.TemporaryDirectory(prefix="kernelswarm-submit-") as folder:
        root = Path(folder)
        for field, text in texts.items():
            (root / FILE_NAMES[field]).write_text(text, encoding="utf-8")
        try:
            problem = load_problem(root, with_seeds=False)
        except FormatError as error:
            raise SubmissionError(_by_field(str(error), root)) from None
    _check_web_rules(problem)
    too_large = oversized(problem, max_workload_bytes) if max_workload_bytes is not None else []
    if too_large:
        raise SubmissionError({WORKLOADS: [f"workload.jsonl: {line}" for line in too_large]})
    _check_storable(problem)
    return dataclasses.replace(problem, root=None)


def _text_error(text: str, field: str) -> str | None:
    """Empty, too large, or not writable as UTF-8 (a lone surrogate, which JSON's `\\ud800` can carry)."""
    if not text.strip():
        return f"{FILE_NAMES[field]} is empty"
    try:
        size = len(text.encode())
    except UnicodeEncodeError as error:
        return f"{FILE_NAMES[field]} is not UTF-8 text: character {error.start} is a lone surrogate"
    if size > MAX_BYTES[field]:
        return f"{FILE_NAMES[field]} is larger than {MAX_BYTES[field] // 1024} KiB"
    return None


def _by_field(message: str, root: Path) -> dict[str, list[str]]:
    """load_problem's messages start with the file's path: that names the field; the temp folder
    is left out of what the user sees."""
    errors: dict[str, list[str]] = {}
    field = DEFINITION
    for line in message.splitlines():  # a line without a path continues the one before
        field = next((f for f, file_name in FILE_NAMES.items() if line.startswith(str(root / file_name))), field)
        errors.setdefault(field, []).append(line.replace(f"{root}/", ""))
    return errors


def _check_web_rules(problem: Problem) -> None:
    """What the CLI allows but a form cannot: files beside the definition, and names that are not
    plain URL path segments."""
    if not NAME.fullmatch(problem.name):
        raise SubmissionError({DEFINITION: [
            f"definition.json: $.name: {problem.name!r} must be 1-128 letters, digits, `_`, `.` or `-`, "
            "starting with a letter or digit"]})
    if len(problem.workloads) > MAX_WORKLOADS:
        raise SubmissionError({WORKLOADS: [f"workload.jsonl: more than {MAX_WORKLOADS} workloads"]})
    for number, workload in enumerate(problem.workloads, start=1):
        for name, spec in workload.inputs.items():
            if isinstance(spec, SafetensorsInput):
                raise SubmissionError({WORKLOADS: [
                    f"workload.jsonl: workload {number}: {child_path('$.inputs', name)}: safetensors inputs need files "
                    "that the form cannot take; use `random`, `scalar` or `custom` inputs"]})


def _check_storable(problem: Problem) -> None:
    """What the DB's columns hold (PostgreSQL refuses what SQLite lets pass): `op_type` in 64
    characters, no NUL in the text columns, workload uuids in 64 characters (traces rows)."""
    definition = problem.definition
    for key in ("op_type", "description"):
        value = getattr(definition, key)
        if value is not None and "\x00" in value:
            raise SubmissionError({DEFINITION: [f"definition.json: $.{key}: must not contain a NUL character"]})
    if definition.op_type is not None and len(definition.op_type) > MAX_OP_TYPE:
        raise SubmissionError({DEFINITION: [f"definition.json: $.op_type: longer than {MAX_OP_TYPE} characters"]})
    for number, workload in enumerate(problem.workloads, start=1):
        if len(workload.uuid) > MAX_UUID or "\x00" in workload.uuid:
            raise SubmissionError({WORKLOADS: [
                f"workload.jsonl: workload {number}: $.uuid: must be at most {MAX_UUID} characters, without NUL"]})


def reference_solution(problem: Problem) -> Solution:
    """The reference as a `pytorch` solution that returns its outputs (not destination passing)."""
    return Solution(
        name=f"{problem.name}_reference", definition=problem.name, author=REFERENCE_AUTHOR,
        description="The problem's PyTorch reference, run in the sandbox when the problem was submitted.",
        spec=BuildSpec(languages=[Language.PYTORCH], target_hardware=list(Hardware),
                       entry_point=f"{REFERENCE_FILE}::run", destination_passing_style=False),
        sources=[SourceFile(path=REFERENCE_FILE, content=problem.definition.reference)],
    )


class RateLimited(SubmissionError):
    http_status = 429


def accept(db: Database, store: ObjectStore, problem: Problem, default_device: str,
           send_evaluate: SendEvaluate | None, limit_per_hour: int | None = None) -> Accepted:
    """Record the problem, add it to every RUNNING or PAUSED campaign, record one reference attempt
    per device those campaigns use (or the default device), commit, then send the attempts.
    With `limit_per_hour`, refuse (429) once that many submitted problems arrived in the last hour."""
    try:
        with db.session() as session:
            if limit_per_hour is not None:
                _check_rate(session, limit_per_hour)
            if session.scalar(select(ProblemRow.id).where(ProblemRow.name == problem.name)) is not None:
                raise _name_taken(problem.name)
            row = upsert_problem(session, problem)
            solution_hash = put_solution(session, store, row.id, reference_solution(problem))
            campaigns = session.scalars(select(CampaignRow).where(
                CampaignRow.status.in_(CAMPAIGNS_TAKING_PROBLEMS)).order_by(CampaignRow.id)).all()
            for campaign in campaigns:
                last = session.scalar(select(func.max(CampaignProblemRow.position)).where(
                    CampaignProblemRow.campaign_id == campaign.id))
                session.add(CampaignProblemRow(campaign_id=campaign.id, problem_id=row.id,
                                               position=0 if last is None else last + 1))
            targets: dict[str, int | None] = {}
            for campaign in campaigns:
                targets.setdefault(campaign.device, campaign.id)
            attempts = [create_attempt(session, row.id, solution_hash, device, campaign_id=campaign_id)
                        for device, campaign_id in (targets or {default_device: None}).items()]
            sends = [(a.id, a.device) for a in attempts]
            problem_id = row.id
    except IntegrityError:  # the same name submitted at the same moment
        raise _name_taken(problem.name) from None
    queued = _send(sends, send_evaluate)
    log.info("problem submitted name=%s id=%s attempts=%s queued=%s", problem.name, problem_id,
             [a for a, _ in sends], queued)
    return Accepted(name=problem.name, problem_id=problem_id, workloads=len(problem.workloads),
                    attempt_ids=[a for a, _ in sends], campaign_ids=[c.id for c in campaigns], queued=queued)


def _check_rate(session, limit_per_hour: int) -> None:
    """Submitted problems (those without a folder on disk) in the last hour, against the limit."""
    since = utcnow() - timedelta(hours=1)
    recent = session.scalar(select(func.count()).select_from(ProblemRow).where(
        ProblemRow.source_path.is_(None), ProblemRow.created_at >= since))
    if recent >= limit_per_hour:
        raise RateLimited({DEFINITION: [f"too many submissions: {recent} problems in the last hour (the limit "
                                        f"is {limit_per_hour}); try again later"]})


def _send(sends: list[tuple[str, str]], send_evaluate: SendEvaluate | None) -> bool:
    if send_evaluate is None:
        return False
    try:
        for attempt_id, device in sends:
            send_evaluate(attempt_id, device)
    except OperationalError as error:  # the rows are committed: the attempts wait as PENDING
        log.warning("cannot send the reference check attempts=%s error=%r", sends, error)
        return False
    return True


def _name_taken(name: str) -> SubmissionError:
    return SubmissionError({DEFINITION: [f"definition.json: $.name: a problem named {name!r} exists; "
                                         "choose another name"]})

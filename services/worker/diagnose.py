"""A writer's diagnostic tools, `profile` and `inspect`, as attempts the evaluators answer
(`services/evaluator/tools/`): the solution stored, an attempt of that kind recorded with its
arguments and the tokens of the turn that asked for it, sent on the evaluate queue like any
attempt, waited for; its status and message are the text the model reads. Its GPU seconds and
tokens count toward budgets like an evaluation's; its outcome counts as no verdict anywhere."""

from __future__ import annotations

import platform
from collections.abc import Callable

from shared.db import AttemptRow
from shared.repository import INSPECT, IN_FLIGHT, PROFILE, create_attempt, put_solution
from shared.runtime import Runtime
from shared.schema import Solution

LISTED_WORKLOADS = 8  # workload uuids named back to a model that named none the problem has


def diagnose(runtime: Runtime, job, model_name: str, solution: Solution, kind: str, *,
             workload_uuid: str | None = None, kernel: str | None = None, tokens: int = 0,
             send_evaluate: Callable[[str, str], None], wait: Callable[[str], str]) -> str:
    """`kind`: "profile" (on `workload_uuid`, the problem's first workload where None) or
    "inspect" (the SASS of `kernel`; None: the only kernel, else the list of names). Returns
    "status: PROFILED" (or INSPECTED, or the error's status) and the evaluator's text below it."""
    if kind not in (PROFILE, INSPECT):
        return f"status: UNSUPPORTED\nno diagnostic tool `{kind}` (profile, inspect)"
    workloads, note = None, ""
    tool_args: dict = {}
    if kind == PROFILE:
        known = tuple(job.workloads)
        if workload_uuid is None and known:
            workload_uuid, note = known[0], f"(no workload named: profiled the problem's first, {known[0]})\n"
        if workload_uuid not in known:
            shown = ", ".join(known[:LISTED_WORKLOADS]) + (" ..." if len(known) > LISTED_WORKLOADS else "")
            return f"status: UNSUPPORTED\nthe problem has no workload {workload_uuid!r}; its workloads: {shown}"
        workloads, tool_args = [workload_uuid], {"workload": workload_uuid}
    elif kernel is not None:
        tool_args = {"kernel": str(kernel)}
    attempt_id = _record(runtime, job, model_name, solution, kind, workloads, tool_args, tokens)
    send_evaluate(attempt_id, job.device)
    status = wait(attempt_id)
    with runtime.db.session() as session:
        message = session.get(AttemptRow, attempt_id).message or ""
    if status in IN_FLIGHT:
        return f"status: {status}\nthe {kind} answer did not arrive in time (attempt {attempt_id})"
    return f"status: {status}\n{note}{message}".rstrip()


def _record(runtime: Runtime, job, model_name: str, solution: Solution, kind: str, workloads: list[str] | None,
            tool_args: dict, tokens: int) -> str:
    with runtime.db.session() as session:
        digest = put_solution(session, runtime.store, job.problem_id, solution, job.parent_hash)
        attempt = create_attempt(session, job.problem_id, digest, job.device, campaign_id=job.campaign_id,
                                 assignment_id=job.assignment_id, worker=platform.node(), workload_uuids=workloads,
                                 kind=kind, tool_args=tool_args or None)
        attempt.model, attempt.tokens = model_name, tokens
        return attempt.id  # committed when the session closes, before the task is sent

"""Reading and writing the records two services share: problems, solutions, attempts."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from shared.db import AttemptRow, ProblemRow, SolutionRow
from shared.errors import NotFoundError
from shared.schema import Definition, Problem, Solution, Workload, parse_model
from shared.store import ObjectStore

FINISHED = "FINISHED"  # not a status: the set of statuses other than PENDING and RUNNING
IN_FLIGHT = ("PENDING", "RUNNING")
PASSED = "PASSED"
PARTIAL = "PARTIAL"  # passed the workloads it ran, which were not all of them: never ranked as a record
REFERENCE_AUTHOR = "reference"  # the author of a problem's reference run as a solution (its check on submission)
# The evaluators' faults (a full disk, a lost checker, a CUDA context not made, the store down)
# outlasted every retry: no verdict. Not a trace status; counted for no problem and no writer.
NOT_EVALUATED = "NOT_EVALUATED"
# An attempt's kind (`AttemptRow.kind`): an evaluation (a verdict), or a writer's diagnostic tool,
# answered with text and a status of its own that is never a verdict. Whatever counts or ranks
# outcomes reads `kind == VERDICT_KIND` only; costs (GPU seconds, tokens) count for every kind.
VERDICT_KIND = "evaluate"
PROFILE, INSPECT = "profile", "inspect"
PROFILED, INSPECTED = "PROFILED", "INSPECTED"


def upsert_problem(session: Session, problem: Problem) -> ProblemRow:
    """Insert the problem, or update it in place when its name exists (ids stay stable)."""
    row = session.scalar(select(ProblemRow).where(ProblemRow.name == problem.name))
    if row is None:
        row = ProblemRow(name=problem.name)
        session.add(row)
    row.op_type = problem.definition.op_type
    row.description = problem.definition.description
    row.source_path = str(problem.root.resolve()) if problem.root else None
    row.definition_json = problem.definition.model_dump_json(exclude_unset=True)
    row.workloads_jsonl = "".join(w.model_dump_json(exclude_unset=True) + "\n" for w in problem.workloads)
    session.flush()
    return row


def problem_from_row(row: ProblemRow) -> Problem:
    definition = parse_model(Definition, json.loads(row.definition_json), f"problem {row.name}")
    workloads = tuple(parse_model(Workload, json.loads(line), f"problem {row.name} workload")
                      for line in row.workloads_jsonl.splitlines() if line.strip())
    return Problem(definition, workloads, Path(row.source_path) if row.source_path else None)


def problem_by_name(session: Session, name: str) -> ProblemRow:
    row = session.scalar(select(ProblemRow).where(ProblemRow.name == name))
    if row is None:
        raise NotFoundError(f"no problem named {name!r}")
    return row


def put_solution(session: Session, store: ObjectStore, problem_id: int, solution: Solution,
                 parent_hash: str | None = None) -> str:
    """Store the sources by content hash and record the solution once; returns the hash."""
    digest = store.put(solution.canonical_json())
    if session.get(SolutionRow, digest) is None:
        session.add(SolutionRow(hash=digest, problem_id=problem_id, name=solution.name, author=solution.author,
                                language=solution.spec.language.value, parent_hash=parent_hash))
        session.flush()
    return digest


def get_solution(store: ObjectStore, digest: str) -> Solution:
    return parse_model(Solution, json.loads(store.get(digest)), f"solution {digest}")


def create_attempt(session: Session, problem_id: int, solution_hash: str, device: str, *,
                   campaign_id: int | None = None, assignment_id: int | None = None,
                   worker: str | None = None, workload_uuids: Sequence[str] | None = None,
                   kind: str = VERDICT_KIND, tool_args: dict | None = None) -> AttemptRow:
    """`workload_uuids`: run only these of the problem's workloads (None: all); recorded on the row,
    so that the evaluator, and whoever reads the verdict, knows the attempt was partial. `kind`:
    an evaluation, or a diagnostic tool (`PROFILE`, `INSPECT`) with its arguments `tool_args`."""
    row = AttemptRow(id=str(uuid.uuid4()), problem_id=problem_id, solution_hash=solution_hash, device=device,
                     campaign_id=campaign_id, assignment_id=assignment_id, worker=worker, status="PENDING",
                     workload_uuids=json.dumps(list(workload_uuids)) if workload_uuids is not None else None,
                     kind=kind, tool_args=json.dumps(tool_args) if tool_args is not None else None)
    session.add(row)
    session.flush()
    return row


def attempt_workloads(problem: Problem, workload_uuids: str | None) -> Problem:
    """The problem restricted to the workloads an attempt runs (`AttemptRow.workload_uuids`), in
    the problem's order; unchanged when the attempt runs them all."""
    if workload_uuids is None:
        return problem
    wanted = set(json.loads(workload_uuids))
    return dataclasses.replace(problem, workloads=tuple(w for w in problem.workloads if w.uuid in wanted))

"""The LLM writer: a multi-turn loop in which the model writes a solution, calls the evaluator as a
tool, reads compact feedback, and tries again until its budget is spent or it submits.

The loop knows nothing of queues or the DB: it gets a `ChatModel`-like object and an `evaluate`
callable (solution, tokens spent since the last call) -> Feedback. `write.py` binds both.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from services.evaluator.languages import default_entry
from services.worker.llm import Reply
from shared.schema import Problem, Solution
from shared.schema.base import format_validation_error

PROTOCOL = (Path(__file__).resolve().parent / "PROTOCOL.md").read_text()
FENCE = re.compile(r"```([\w+-]*)[ \t]+([^\s`]+)[ \t]*\n(.*?)```", re.DOTALL)


class Model(Protocol):
    model: str

    def complete(self, messages: list[dict[str, Any]]) -> Reply: ...


@dataclass(frozen=True)
class Feedback:
    status: str
    text: str


@dataclass(frozen=True)
class Budget:
    turns: int = 16
    evaluations: int = 8
    tokens: int = 400_000
    wall_s: float = 3600.0


@dataclass(frozen=True)
class SessionResult:
    turns: int
    evaluations: int
    tokens: int
    submitted: bool
    stopped_by: str  # "submit", "turns", "evaluations", "tokens", "wall time"


EvaluateFn = Callable[[Solution, int], Feedback]


def run_session(model: Model, problem: Problem, brief: str, evaluate: EvaluateFn, budget: Budget,
                default_language: str = "cuda") -> SessionResult:
    messages: list[dict[str, Any]] = [{"role": "system", "content": PROTOCOL}, {"role": "user", "content": brief}]
    started = time.monotonic()
    turns = evaluations = tokens = unattributed = 0
    while True:
        stop = _spent(budget, turns, evaluations, tokens, time.monotonic() - started)
        if stop:
            return SessionResult(turns, evaluations, tokens, False, stop)
        reply = model.complete(messages)
        turns, tokens, unattributed = turns + 1, tokens + reply.tokens, unattributed + reply.tokens
        messages.append(reply.raw or {"role": "assistant", "content": reply.text})
        if reply.tool_calls:
            submitted = False
            for call in reply.tool_calls:
                if call.name == "submit":
                    submitted = True
                    answer = "submitted"
                elif call.name == "evaluate" and evaluations < budget.evaluations:
                    answer, made = _evaluate(problem, model.model, evaluations, call.arguments, evaluate, unattributed)
                    evaluations, unattributed = evaluations + made, 0 if made else unattributed
                else:
                    answer = f"unknown tool {call.name!r}" if call.name != "evaluate" else "evaluation budget spent"
                messages.append({"role": "tool", "tool_call_id": call.id, "content": answer})
            if submitted:
                return SessionResult(turns, evaluations, tokens, True, "submit")
            continue
        if re.search(r"^\s*SUBMIT\s*$", reply.text, re.MULTILINE):
            return SessionResult(turns, evaluations, tokens, True, "submit")
        arguments = parse_fenced(reply.text, default_language)
        if arguments is None:
            answer = ("No solution found in your answer. Call the `evaluate` tool, or send fenced code blocks "
                      "with the file path after the language tag, or SUBMIT to finish.")
        else:
            answer, made = _evaluate(problem, model.model, evaluations, arguments, evaluate, unattributed)
            evaluations, unattributed = evaluations + made, 0 if made else unattributed
        messages.append({"role": "user", "content": answer})


def _spent(budget: Budget, turns: int, evaluations: int, tokens: int, elapsed_s: float) -> str | None:
    if turns >= budget.turns:
        return "turns"
    if evaluations >= budget.evaluations:
        return "evaluations"
    if tokens >= budget.tokens:
        return "tokens"
    if elapsed_s >= budget.wall_s:
        return "wall time"
    return None


def _evaluate(problem: Problem, author: str, number: int, arguments: dict[str, Any], evaluate: EvaluateFn,
              tokens: int) -> tuple[str, int]:
    """(feedback text, 1 if an attempt was made else 0). A malformed solution costs no attempt."""
    try:
        solution = solution_from_arguments(problem, author, number, arguments)
    except ValueError as error:
        return f"status: INVALID_SOLUTION (not evaluated)\n{error}", 0
    return evaluate(solution, tokens).text, 1


def solution_from_arguments(problem: Problem, author: str, number: int, arguments: dict[str, Any]) -> Solution:
    if "_invalid_json" in arguments:
        raise ValueError("the tool arguments are not valid JSON")
    language = arguments.get("language", "cuda")
    data = {
        "name": f"{problem.name}-{_slug(author)}-{number + 1}", "definition": problem.name, "author": author,
        "spec": {"languages": [language], "target_hardware": ["LOCAL"],
                 "entry_point": arguments.get("entry_point") or default_entry(language),
                 "destination_passing_style": arguments.get("destination_passing_style", True),
                 "tunables": arguments.get("tunables") or {}},
        "sources": arguments.get("files") or [],
    }
    try:
        return Solution.model_validate(data)
    except ValidationError as error:
        raise ValueError(format_validation_error(error, data, "solution")) from None


def parse_fenced(text: str, default_language: str) -> dict[str, Any] | None:
    """Fenced files (```lang path ... ```) plus optional `language:` / `entry_point:` lines."""
    files = [{"path": path, "content": body} for _tag, path, body in FENCE.findall(text)]
    if not files:
        return None
    language = _header(text, "language") or default_language
    arguments: dict[str, Any] = {"language": language, "files": files}
    entry = _header(text, "entry_point")
    if entry:
        arguments["entry_point"] = entry
    elif language != "cuda":
        python = next((f["path"] for f in files if f["path"].endswith(".py")), "main.py")
        arguments["entry_point"] = f"{python}::run"
    return arguments


def _header(text: str, key: str) -> str | None:
    match = re.search(rf"^\s*{key}\s*:\s*(\S+)\s*$", text, re.MULTILINE)
    return match.group(1) if match else None


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:40]


def problem_brief(problem: Problem, per_workload: dict[str, dict[str, float]] | None = None,
                  best: tuple[Solution, str] | None = None, guidance: str | None = None, device: str = "cuda") -> str:
    """What the model needs of the problem: reference, tensors, workloads with their T_sol and T_b,
    the current best with its results, and the planner's guidance."""
    d = problem.definition
    lines = [f"# Problem {d.name}", d.description or "", "", f"Target device: {device}.", "", "## Reference",
             "```python", d.reference.strip(), "```", "", "## Tensors"]
    for kind, tensors in (("input", d.inputs), ("output", d.outputs)):
        for name, spec in tensors.items():
            lines.append(f"- {kind} `{name}`: {spec.dtype.value} {spec.shape}")
    lines += ["", "## Axes", json.dumps({n: a.model_dump(exclude_none=True) for n, a in d.axes.items()}), "",
              f"## Workloads ({len(problem.workloads)})"]
    for workload in problem.workloads:
        figures = (per_workload or {}).get(workload.uuid, {})
        extra = ", ".join(f"{k} {v:.4g} ms" for k, v in figures.items())
        lines.append(f"- {json.dumps(workload.axes)}" + (f": {extra}" if extra else ""))
    if best is not None:
        solution, results = best
        lines += ["", "## Current best solution", results, "", "```json",
                  json.dumps([s.model_dump() for s in solution.sources], indent=1)[:12000], "```"]
    if guidance:
        lines += ["", "## Guidance from the planner", guidance]
    lines += ["", "Write a correct solution first, evaluate it, then make it faster."]
    return "\n".join(lines)

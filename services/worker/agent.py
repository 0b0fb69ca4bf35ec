"""The LLM writer: a multi-turn loop in which the model writes a solution, calls the evaluator as a
tool, reads compact feedback, and tries again until its budget is spent or it submits.

The loop knows nothing of queues or the DB: it gets a `Model` and a set of `Tools` (evaluate, and
the optional profile, inspect and note); `llm_writer.py` binds them to the swarm. Every request is
fitted to the model's context (`context.py`). Where the endpoint takes no tools, the protocol is
rendered without them and the model sends fenced files.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from services.evaluator.languages import default_entry
from services.worker.context import START_CHARS_PER_TOKEN, Turn, fit, message_chars
from services.worker.llm import ContextTooLong, Reply, ToolsRefused, tool_schemas
from shared.errors import EndpointError, EndpointUnavailable
from shared.schema import Problem, Solution
from shared.schema.base import format_validation_error

PROTOCOL = (Path(__file__).resolve().parent / "PROTOCOL.md").read_text()
FENCE = re.compile(r"```([\w+-]*)[ \t]+([^\s`]+)[ \t]*\n(.*?)```", re.DOTALL)
CONTEXT_TRIES = 4  # requests refused for their length before the session gives up


class Model(Protocol):
    model: str
    tools_supported: bool

    def complete(self, messages: list[dict[str, Any]], tools: Sequence[str]) -> Reply: ...


@dataclass(frozen=True)
class Feedback:
    status: str
    text: str


@dataclass(frozen=True)
class Budget:
    turns: int = 16
    evaluations: int = 8  # evaluate, profile and inspect calls together: each is a recorded attempt
    tokens: int = 400_000
    wall_s: float = 3600.0
    notes: int = 4


@dataclass(frozen=True)
class SessionResult:
    turns: int
    evaluations: int
    tokens: int
    submitted: bool
    stopped_by: str  # "submit", "turns", "evaluations", "tokens", "wall time"


EvaluateFn = Callable[[Solution, int], Feedback]  # (solution, tokens since the last recorded attempt)


@dataclass(frozen=True)
class Tools:
    """What the model may call besides `submit`; a tool left None is not offered. `profile` and
    `inspect` are recorded attempts like `evaluate` (they get the tokens since the last one and
    count against the evaluation budget); `note` is free, at most `Budget.notes` a session."""

    evaluate: EvaluateFn  # (Solution, tokens) -> Feedback
    profile: Callable[[Solution, str, int], str] | None = None  # (solution, workload uuid, tokens) -> text
    inspect: Callable[[Solution, str | None, int], str] | None = None  # (solution, kernel or None, tokens) -> text
    note: Callable[[str], str] | None = None  # (markdown text) -> short confirmation

    def names(self) -> tuple[str, ...]:
        optional = tuple(n for n in ("profile", "inspect", "note") if getattr(self, n) is not None)
        return ("evaluate", *optional, "submit")


@dataclass(frozen=True)
class SessionConfig:
    default_language: str = "cuda"  # of fenced files without a `language:` line
    context_tokens: int = 32768  # the model's context
    reply_tokens: int = 4096  # of it, kept free for the reply
    turn_retries: int = 2  # a turn the endpoint could not answer now (rate limit, timeout) is asked again
    retry_wait_s: float = 15.0  # before the first of them, doubling


TokensFn = Callable[[int], None]  # tokens no recorded attempt carries, told at the end of the session


def run_session(model: Model, problem: Problem, brief: str, tools: Tools | EvaluateFn, budget: Budget,
                config: SessionConfig = SessionConfig(), record_tokens: TokensFn | None = None) -> SessionResult:
    """One session. Every turn's tokens are accounted: those of the turns before a recorded attempt
    go with it, the rest (a closing `submit`, turns after the last attempt) to `record_tokens`,
    also when the session ends on an error."""
    session = _Session(model, problem, brief, tools if isinstance(tools, Tools) else Tools(tools), budget, config)
    try:
        return session.run()
    finally:
        if session.unattributed and record_tokens is not None:
            record_tokens(session.unattributed)


def render_protocol(tool_calls: bool, tools: Sequence[str] = ()) -> str:
    """PROTOCOL.md for this session: `<!-- if tools -->...<!-- end -->` kept only with tool calls,
    `<!-- if fenced -->...<!-- end -->` only without, `<!-- if tool:NAME -->...<!-- end -->` only
    when NAME is offered; every other comment removed."""
    def keep(match: re.Match) -> str:
        condition, body = match.group(1).strip(), match.group(2)
        if condition == "tools":
            return body if tool_calls else ""
        if condition == "fenced":
            return "" if tool_calls else body
        if condition.startswith("tool:"):
            return body if tool_calls and condition[5:] in tools else ""
        return body
    text = re.sub(r"<!-- if ([^>]*?) -->(.*?)<!-- end -->", keep, PROTOCOL, flags=re.DOTALL)
    text = re.sub(r"<!--.*?-->\n?", "", text, flags=re.DOTALL)
    return re.sub(r"\n{3,}", "\n\n", text)


class _Session:
    def __init__(self, model: Model, problem: Problem, brief: str, tools: Tools, budget: Budget,
                 config: SessionConfig) -> None:
        self.model, self.problem, self.brief, self.tools, self.budget, self.config = (
            model, problem, brief, tools, budget, config)
        self.history: list[Turn] = []
        self.turns = self.evaluations = self.tokens = self.unattributed = self.notes = 0
        self.chars_per_token = START_CHARS_PER_TOKEN
        self.context_tokens = config.context_tokens
        self.started = time.monotonic()

    def run(self) -> SessionResult:
        while True:
            stop = _spent(self.budget, self.turns, self.evaluations, self.tokens, time.monotonic() - self.started)
            if stop:
                return self._result(False, stop)
            reply = self._ask()
            self.turns, self.tokens = self.turns + 1, self.tokens + reply.tokens
            self.unattributed += reply.tokens
            assistant = reply.raw or {"role": "assistant", "content": reply.text}
            if reply.tool_calls:
                if self._calls(assistant, reply):
                    return self._result(True, "submit")
                continue
            if re.search(r"^\s*SUBMIT\s*$", reply.text, re.MULTILINE):
                return self._result(True, "submit")
            self._fenced(assistant, reply.text)

    def _result(self, submitted: bool, stopped_by: str) -> SessionResult:
        return SessionResult(self.turns, self.evaluations, self.tokens, submitted, stopped_by)

    def _ask(self) -> Reply:
        """The model's next reply to the history fitted to its context: asked again, shorter, when
        the endpoint says it is too long, and without tools when it refuses them."""
        refused = retried = 0
        while True:
            tool_calls = self.model.tools_supported
            names = self.tools.names() if tool_calls else ()
            overhead = len(json.dumps(tool_schemas(names))) if names else 0
            system = render_protocol(tool_calls, names)
            messages = fit(system, self.brief, self.history, self.context_tokens - self.config.reply_tokens,
                           self.chars_per_token, overhead)
            try:
                reply = self.model.complete(messages, names)
            except ToolsRefused:
                continue  # tools_supported is False now: the protocol is rendered for fenced files
            except EndpointUnavailable:
                if retried >= self.config.turn_retries:
                    raise  # the write task retries later; this conversation is lost
                time.sleep(self.config.retry_wait_s * 2 ** retried)
                retried += 1
                continue  # the same conversation, asked again
            except ContextTooLong as error:
                refused += 1
                if refused >= CONTEXT_TRIES:
                    raise EndpointError("context", f"{error}; the protocol, the brief and the last turn do not fit: "
                                        "set KERNELSWARM_AGENT_CONTEXT_TOKENS to the model's context") from error
                limit = error.limit_tokens or self.context_tokens
                self.context_tokens = int(min(limit, self.context_tokens) * 0.8)
                continue
            if reply.prompt_tokens > 0:  # the endpoint's count corrects the estimate, with a margin
                sent = sum(message_chars(m) for m in messages) + overhead
                self.chars_per_token = min(6.0, max(1.5, 0.9 * sent / reply.prompt_tokens))
            return reply

    def _calls(self, assistant: dict[str, Any], reply: Reply) -> bool:
        """Answer every tool call of the reply; True when one was `submit`."""
        answers, done, passed = [], [], False
        for call in reply.tool_calls:
            answer, status = self._call(call.name, call.arguments)
            passed = passed or status == "PASSED"
            answers.append({"role": "tool", "tool_call_id": call.id, "content": answer})
            done.append(f"{call.name}{_what(call.arguments)} -> {_gist(answer)}")
        self.history.append(Turn(self.turns, [assistant, *answers], "; ".join(done), passed))
        return any(call.name == "submit" for call in reply.tool_calls)

    def _call(self, name: str, arguments: dict[str, Any]) -> tuple[str, str | None]:
        """(the answer, the verdict's status when an evaluation made one)."""
        tools = self.tools
        if name == "submit":
            return "submitted", None
        if name == "note" and tools.note is not None:
            if self.notes >= self.budget.notes:
                return f"note refused: at most {self.budget.notes} notes a session", None
            self.notes += 1
            return tools.note(str(arguments.get("text", ""))), None
        if name not in ("evaluate", "profile", "inspect") or getattr(tools, name) is None:
            return f"unknown tool {name!r}", None
        if self.evaluations >= self.budget.evaluations:
            return "evaluation budget spent: submit now", None
        try:
            solution = solution_from_arguments(self.problem, self.model.model, self.evaluations, arguments)
            workload = self._workload(arguments) if name == "profile" else None
        except ValueError as error:
            return f"status: INVALID_SOLUTION (not evaluated)\n{error}", None
        tokens, self.unattributed = self.unattributed, 0
        self.evaluations += 1
        if name == "profile":
            return tools.profile(solution, workload, tokens), None
        if name == "inspect":
            kernel = arguments.get("kernel")
            return tools.inspect(solution, str(kernel) if kernel else None, tokens), None
        feedback = tools.evaluate(solution, tokens)
        return feedback.text, feedback.status

    def _workload(self, arguments: dict[str, Any]) -> str:
        """The uuid of the workload that `workload` names: its number in the brief's list, or its uuid."""
        workloads = self.problem.workloads
        value = arguments.get("workload")
        if isinstance(value, str) and not value.isdigit():
            if any(w.uuid == value for w in workloads):
                return value
            raise ValueError(f"no workload {value!r}")
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"`workload` is the workload's number, 1 to {len(workloads)}") from None
        if not 1 <= number <= len(workloads):
            raise ValueError(f"`workload` is the workload's number, 1 to {len(workloads)}, not {number}")
        return workloads[number - 1].uuid

    def _fenced(self, assistant: dict[str, Any], text: str) -> None:
        arguments = parse_fenced(text, self.config.default_language)
        status = None
        if arguments is None:
            tools = "Call the `evaluate` tool, or send" if self.model.tools_supported else "Send"
            answer = (f"No solution found in your answer. {tools} fenced code blocks with the file path after "
                      "the language tag, or SUBMIT to finish.")
        elif self.evaluations >= self.budget.evaluations:
            answer = "evaluation budget spent: SUBMIT now"
        else:
            answer, status = self._call("evaluate", arguments)
        what = f"fenced files{_what(arguments)}" if arguments else "text without a solution"
        self.history.append(Turn(self.turns, [assistant, {"role": "user", "content": answer}],
                                 f"{what} -> {_gist(answer)}", status == "PASSED"))


def _what(arguments: dict[str, Any] | None) -> str:
    """A call's arguments in a few words: language and file names, or the workload or kernel."""
    if not arguments:
        return ""
    bits = [str(arguments["language"])] if "language" in arguments else []
    files = arguments.get("files")
    if isinstance(files, list):
        bits += [f"{f.get('path')} {len(str(f.get('content', '')))} chars" for f in files if isinstance(f, dict)]
    bits += [f"{key} {arguments[key]}" for key in ("workload", "kernel") if key in arguments]
    if "text" in arguments:
        bits.append(f"{len(str(arguments['text']))} chars")
    return f"({', '.join(bits)})" if bits else ""


def _gist(answer: str) -> str:
    return " | ".join(line.strip() for line in answer.strip().splitlines()[:2])[:160]


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
    """Fenced files (```lang path ... ```) plus optional `language:`, `entry_point:`, `tunables:`
    (JSON) and `destination_passing_style:` lines."""
    files = [{"path": path, "content": body} for _tag, path, body in FENCE.findall(text)]
    if not files:
        return None
    language = _header(text, "language") or default_language
    arguments: dict[str, Any] = {"language": language, "files": files}
    tunables = re.search(r"^\s*tunables\s*:\s*(\{.*\})\s*$", text, re.MULTILINE)
    if tunables:
        try:
            arguments["tunables"] = json.loads(tunables.group(1))
        except json.JSONDecodeError:
            arguments["tunables"] = {"_invalid": tunables.group(1)}  # refused, naming the field
    if (_header(text, "destination_passing_style") or "").lower() == "false":
        arguments["destination_passing_style"] = False
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


LANGUAGE_TAGS = {".cu": "cuda", ".cuh": "cuda", ".py": "python", ".cpp": "cpp", ".cc": "cpp", ".h": "cpp",
                 ".hpp": "cpp"}
BEST_CHARS = 16000  # the current best's sources in the brief, at most


def problem_brief(problem: Problem, per_workload: dict[str, dict[str, float]] | None = None,
                  best: tuple[Solution, str] | None = None, guidance: str | None = None, device: str = "cuda",
                  notes: str | None = None) -> str:
    """What the model needs of the problem: reference, tensors, the workloads numbered with what
    is known of each (`per_workload`: uuid -> {"reference": ms, "T_b": ms, "T_sol": ms}), the
    current best as fenced files with its results, the problem's notes and the planner's guidance."""
    d = problem.definition
    lines = [f"# Problem {d.name}", d.description or "", "", f"Target device: {device}.", "", "## Reference",
             "```python", d.reference.strip(), "```", "", "## Tensors"]
    for kind, tensors in (("input", d.inputs), ("output", d.outputs)):
        for name, spec in tensors.items():
            lines.append(f"- {kind} `{name}`: {spec.dtype.value} {spec.shape}")
    lines += ["", "## Axes", json.dumps({n: a.model_dump(exclude_none=True) for n, a in d.axes.items()}), "",
              f"## Workloads ({len(problem.workloads)})"]
    for number, workload in enumerate(problem.workloads, 1):
        figures = (per_workload or {}).get(workload.uuid, {})
        extra = ", ".join(f"{k} {v:.4g} ms" for k, v in figures.items())
        lines.append(f"{number}. {json.dumps(workload.axes)}" + (f": {extra}" if extra else ""))
    if best is not None:
        lines += ["", "## Current best solution", best[1], "", *fenced_solution(best[0])]
    if notes and notes.strip():
        lines += ["", "## Notes on this problem (left by earlier writers)", notes.strip()]
    if guidance:
        lines += ["", "## Guidance from the planner", guidance]
    lines += ["", "Write a correct solution first, evaluate it, then make it faster."]
    return "\n".join(lines)


def fenced_solution(solution: Solution, max_chars: int = BEST_CHARS) -> list[str]:
    """A solution as the fenced files a model reads and writes (the format `parse_fenced` takes),
    after its `language:` and `entry_point:` lines and its tunables; files past `max_chars` are
    named, not shown."""
    spec = solution.spec
    lines = [f"language: {spec.languages[0].value}", f"entry_point: {spec.entry_point}"]
    if spec.tunables:
        lines.append(f"tunables: {json.dumps(spec.tunables)}")
    if not spec.destination_passing_style:
        lines.append("destination_passing_style: false")
    shown = 0
    for source in solution.sources:
        if shown + len(source.content) > max_chars:
            lines.append(f"(file {source.path}, {len(source.content)} chars, left out: too long for the brief)")
            continue
        shown += len(source.content)
        fence = "````" if "```" in source.content else "```"
        tag = LANGUAGE_TAGS.get(Path(source.path).suffix, "text")
        lines += [f"{fence}{tag} {source.path}", source.content.rstrip("\n"), fence]
    return lines

"""The model behind an LLM writer: any OpenAI-compatible chat endpoint (OpenAI, vLLM, Ollama, a
gateway). Tool calls where the endpoint takes them; fenced files in plain text where it does not.

Replies are streamed (`stream: true`, usage in the last chunk), so that a long turn is cut off
only when the endpoint stays silent for `read_timeout_s`, never for its total length; an endpoint
that refuses streaming is asked without it from then on (each reply then has `turn_timeout_s`).

What an endpoint's error means (`docs/writers.md`):
- 401/403 `EndpointError("auth")`, 404 `EndpointError("model")`, 429 `insufficient_quota`
  `EndpointError("quota")`: a setting is wrong, nothing is retried.
- 400 that says tools are unsupported: tools are off for this model (`ToolsRefused`; the agent
  then tells the model to send fenced files). 400 that says the context is exceeded:
  `ContextTooLong` (the agent trims its history and asks again). Any other 400/422:
  `EndpointError("request")`.
- 429, 5xx, no connection, a read timeout: `EndpointUnavailable`, retried with backoff.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.evaluator.languages import writer_languages
from shared.errors import EndpointError, EndpointUnavailable

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 30.0
TUNABLE_VALUE = {"anyOf": [{"type": "integer"}, {"type": "number"}, {"type": "string"}, {"type": "boolean"}]}


def _solution_properties() -> dict[str, Any]:
    return {
        "language": {"type": "string", "enum": writer_languages()},  # the evaluator's registry
        "entry_point": {"type": "string", "description": "<file>::<function>, e.g. launch.py::run"},
        "files": {"type": "array", "items": {
            "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"]}},
        "tunables": {"type": "object", "description": "NAME: [values...], e.g. {\"BLOCK\": [128, 256]}",
                     "additionalProperties": {"type": "array", "items": TUNABLE_VALUE}},
        "destination_passing_style": {"type": "boolean"},
    }


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


def tool_schemas(names: Iterable[str]) -> list[dict[str, Any]]:
    """The function schemas of the named tools, in a fixed order (evaluate, profile, inspect, note,
    submit). Every array schema has `items`: the hosted API refuses one without."""
    wanted = set(names)
    solution, needed = _solution_properties(), ["language", "files"]
    schemas = {
        "evaluate": _function("evaluate", "Evaluate a solution on every workload: a recorded attempt.",
                              solution, needed),
        "profile": _function(
            "profile", "Profile a solution on one workload (Nsight Compute figures per kernel): a recorded "
            "attempt, counted against the evaluation budget.",
            {**solution, "workload": {"type": "integer", "minimum": 1,
                                      "description": "the workload's number in the problem's list"}},
            [*needed, "workload"]),
        "inspect": _function(
            "inspect", "Build a solution and show what the compiler made of it (registers, spills, shared "
            "memory, SASS of a kernel): a recorded attempt, counted against the evaluation budget.",
            {**solution, "kernel": {"type": "string", "description": "one kernel's name; all when left out"}},
            needed),
        "note": _function("note", "Leave a short Markdown note on this problem for the writers after you "
                          "(what you tried, what you measured). Free, a few per session.",
                          {"text": {"type": "string"}}, ["text"]),
        "submit": _function("submit", "Finish: the best passing attempt counts.", {}, []),
    }
    return [schema for name, schema in schemas.items() if name in wanted]


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Reply:
    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    tokens: int = 0  # prompt and completion, as the endpoint counted them (estimated where it did not)
    raw: dict[str, Any] = field(default_factory=dict)  # the assistant message, to send back
    prompt_tokens: int = 0  # as the endpoint counted them; 0: it did not say


class ToolsRefused(Exception):
    """The endpoint does not take tools: `tools_supported` is now False; ask again without them."""


class ContextTooLong(Exception):
    """The request exceeded the model's context; `limit_tokens` is the limit where the error names it."""

    def __init__(self, message: str, limit_tokens: int | None) -> None:
        super().__init__(message)
        self.limit_tokens = limit_tokens


class ChatModel:
    """`complete(messages, tools)` -> Reply. Offers the named tools while the endpoint takes tools,
    streams while it takes streaming; each refusal holds for the rest of this object's life."""

    def __init__(self, model: str, base_url: str | None, api_key: str, read_timeout_s: float = 300.0,
                 turn_timeout_s: float = 1800.0, max_retries: int = 2) -> None:
        import openai

        self.model, self.base_url = model, base_url or "https://api.openai.com/v1"
        self._openai = openai
        self._stream_timeout = openai.Timeout(turn_timeout_s, connect=CONNECT_TIMEOUT_S, read=read_timeout_s)
        self._turn_timeout = openai.Timeout(turn_timeout_s, connect=CONNECT_TIMEOUT_S)
        self._client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=self._stream_timeout,
                                     max_retries=max_retries)
        self.tools_supported = True
        self.streaming = True

    def complete(self, messages: list[dict[str, Any]], tools: Sequence[str] = ("evaluate", "submit")) -> Reply:
        request: dict[str, Any] = {"model": self.model, "messages": messages}
        offered = bool(tools) and self.tools_supported
        if offered:
            request["tools"] = tool_schemas(tools)
        try:
            return self._ask(request)
        except self._openai.APIStatusError as error:
            if offered and not _is_context_error(error) and _says_unsupported(error, "tool"):
                log.warning("model=%s endpoint refused tools (%s); fenced files from now on", self.model, error)
                self.tools_supported = False
                raise ToolsRefused(str(error)) from error
            raise self._translate(error) from error
        except (self._openai.APITimeoutError, self._openai.APIConnectionError) as error:
            raise self._translate(error) from error

    def _ask(self, request: dict[str, Any]) -> Reply:
        if self.streaming:
            try:
                stream = self._client.chat.completions.create(
                    **request, stream=True, stream_options={"include_usage": True}, timeout=self._stream_timeout)
                return self._read_stream(stream, request["messages"])
            except self._openai.BadRequestError as error:
                if not _says_unsupported(error, "stream"):
                    raise
                log.warning("model=%s endpoint refused streaming (%s); whole replies from now on", self.model, error)
                self.streaming = False
            except NoChunks:  # a 200 with no event in it: a server that ignores `stream` and sends JSON
                log.warning("model=%s endpoint sent no stream events; whole replies from now on", self.model)
                self.streaming = False
        response = self._client.chat.completions.create(**request, timeout=self._turn_timeout)
        return _reply(response, request["messages"])

    def _read_stream(self, stream: Any, messages: list[dict[str, Any]]) -> Reply:
        import httpx2

        try:
            return _assemble(stream, messages)
        except httpx2.TimeoutException as error:  # silent for read_timeout_s between two chunks
            raise EndpointUnavailable("timeout", self._where(f"no chunk within the read timeout ({error!r})")) \
                from error
        except httpx2.TransportError as error:
            raise EndpointUnavailable("unreachable", self._where(f"the stream broke off ({error!r})")) from error
        finally:
            stream.close()

    def _translate(self, error: Exception) -> Exception:
        """The project's error for an endpoint's (see the module's docstring)."""
        openai = self._openai
        message = self._where(getattr(error, "message", None) or str(error))
        if isinstance(error, (openai.AuthenticationError, openai.PermissionDeniedError)):
            return EndpointError("auth", message + " (check OPENAI_API_KEY)")
        if isinstance(error, openai.NotFoundError):
            return EndpointError("model", message + " (check KERNELSWARM_MODEL and OPENAI_BASE_URL)")
        if isinstance(error, openai.RateLimitError):
            if _code(error) == "insufficient_quota":
                return EndpointError("quota", message)
            return EndpointUnavailable("rate_limit", message)
        if isinstance(error, (openai.BadRequestError, openai.UnprocessableEntityError)):
            if _is_context_error(error):
                return ContextTooLong(message, _context_limit(str(getattr(error, "message", error))))
            return EndpointError("request", message)
        if isinstance(error, openai.APITimeoutError):
            return EndpointUnavailable("timeout", message)
        if isinstance(error, openai.APIConnectionError):
            return EndpointUnavailable("unreachable", message)
        return EndpointUnavailable("server", message)  # 5xx, 408, 409 and the like

    def _where(self, message: str) -> str:
        return f"LLM endpoint {self.base_url} (model {self.model}): {message}"


UNSUPPORTED = ("not support", "unsupported", "enable-auto-tool-choice", "unrecognized request argument",
               "extra inputs are not permitted", "extra_forbidden", "unknown parameter", "not allowed",
               "not enabled", "not available")


def _says_unsupported(error: Any, what: str) -> bool:
    """A 400 that says the request's `what` (tools, stream) is not taken, in the words servers use:
    vLLM's `"auto" tool choice requires --enable-auto-tool-choice`, Ollama's `does not support
    tools`, OpenAI's `Unrecognized request argument supplied: tools`, pydantic's `extra_forbidden`."""
    if getattr(error, "status_code", None) not in (400, 422):
        return False
    text = str(getattr(error, "message", "") or error).lower()
    param = str(_field(error, "param") or "").lower()
    return (param.startswith(what) or what in text) and any(word in text for word in UNSUPPORTED)


CONTEXT_WORDS = ("context length", "context_length", "context window", "maximum context", "too many tokens",
                 "prompt is too long", "reduce the length", "max_new_tokens` must be")  # the last: TGI's


def _is_context_error(error: Any) -> bool:
    text = str(getattr(error, "message", "") or error).lower()
    return _code(error) == "context_length_exceeded" or any(word in text for word in CONTEXT_WORDS)


def _context_limit(text: str) -> int | None:
    match = re.search(r"(?:maximum context length|context length|context window)\D{0,20}(\d{2,8})", text, re.I)
    return int(match.group(1)) if match else None


def _code(error: Any) -> str:
    return str(getattr(error, "code", None) or _field(error, "code") or "")


def _field(error: Any, name: str) -> Any:
    body = getattr(error, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        return inner.get(name) if isinstance(inner, dict) else None
    return None


def _assemble(stream: Any, messages: list[dict[str, Any]]) -> Reply:
    """A reply from its chunks: content deltas joined, tool calls put together by their `index`
    (id and name in the first delta of each, arguments in pieces), usage from the last chunk."""
    parts: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    usage = None
    chunks = 0
    for chunk in stream:
        chunks += 1
        if getattr(chunk, "usage", None) is not None:
            usage = chunk.usage
        for choice in chunk.choices or []:
            delta = choice.delta
            if delta is None:
                continue
            if delta.content:
                parts.append(delta.content)
            for piece in delta.tool_calls or []:
                index = piece.index  # some servers send none: a new id opens a call, pieces go to the last
                if index is None:
                    index = len(calls) if piece.id or not calls else max(calls)
                slot = calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
                slot["id"] = slot["id"] or (piece.id or "")
                if piece.function is not None:
                    slot["name"] = slot["name"] or (piece.function.name or "")
                    slot["arguments"] += piece.function.arguments or ""
    if not chunks:
        raise NoChunks("the streamed reply had no event")
    text = "".join(parts)
    assembled = [(c["id"] or f"call_{i}", c["name"], c["arguments"]) for i, c in sorted(calls.items())]
    return _make_reply(text, assembled, usage, messages)


class NoChunks(Exception):
    """A streamed request answered 200 without a single server-sent event (`_assemble`)."""


def _reply(response: Any, messages: list[dict[str, Any]]) -> Reply:
    message = response.choices[0].message
    calls = [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []]
    return _make_reply(message.content or "", calls, getattr(response, "usage", None), messages)


def _make_reply(text: str, calls: list[tuple[str, str, str]], usage: Any, messages: list[dict[str, Any]]) -> Reply:
    tool_calls = []
    for call_id, name, arguments in calls:
        try:
            parsed = json.loads(arguments or "{}")
        except json.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            parsed = {"_invalid_json": arguments}
        tool_calls.append(ToolCall(call_id, name, parsed))
    raw: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:  # arguments that are not JSON go back as {}: some servers refuse to parse them again
        raw["tool_calls"] = [{"id": c.id, "type": "function", "function": {
            "name": c.name, "arguments": "{}" if "_invalid_json" in c.arguments else arguments}}
            for c, (_id, _name, arguments) in zip(tool_calls, calls)]
    total = int(getattr(usage, "total_tokens", 0) or 0)
    prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
    if not total:  # the endpoint did not count: about 4 characters a token
        total = (len(json.dumps(messages)) + len(text) + sum(len(c[2] or "") for c in calls)) // 4
    return Reply(text, tool_calls, total, raw, prompt)

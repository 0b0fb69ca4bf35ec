"""A small OpenAI-compatible chat server for tests: replays scripted replies, records requests, and
checks each request as strictly as the hosted API does, answering with its error shapes.

What it refuses, as OpenAI's `/v1/chat/completions` would:
- 401 `invalid_api_key` for a key not in `api_keys` (any non-empty key when None);
- 404 `model_not_found` for a model not in `models` (any when None);
- 400 `invalid_request_error` for an unknown top-level parameter, `stream_options` without
  `stream`, a message with an unknown role or a content of the wrong kind, an assistant's tool
  calls not each answered by a `tool` message (with its id) before the next assistant or user
  message, a `tool` message that answers no call, arguments that are not JSON, a tool whose schema
  is not valid JSON Schema (an `array` without `items`, a `required` name not in `properties`,
  an unknown type or keyword);
- 400 `context_length_exceeded` when the request is longer than `context_tokens`, tokens counted
  as characters / 4 (content, tool calls and tool schemas; plus `max_tokens` when given);
- with `refuse_tools`, vLLM's 400 for tools without `--enable-auto-tool-choice`; with
  `refuse_stream`, a 400 that names `stream`.
Scripted items are assistant messages (dicts), `Failure`s (an error status and body, e.g. 429) or
`Slow` messages (a pause before each streamed chunk). Streaming (`stream: true`) answers in SSE
chunks as OpenAI does: content in pieces, each tool call's id and name first and its arguments in
pieces, then `finish_reason`, then a usage chunk when `stream_options.include_usage`.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field

from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

PARAMETERS = {"model", "messages", "tools", "tool_choice", "parallel_tool_calls", "stream", "stream_options",
              "temperature", "top_p", "max_tokens", "max_completion_tokens", "n", "stop", "seed", "user",
              "response_format", "frequency_penalty", "presence_penalty", "logprobs", "top_logprobs",
              "logit_bias", "reasoning_effort", "metadata", "store", "service_tier"}
ROLES = {"system", "developer", "user", "assistant", "tool"}
TYPES = {"object", "array", "string", "integer", "number", "boolean", "null"}
KEYWORDS = {"type", "properties", "required", "items", "additionalProperties", "description", "enum", "anyOf",
            "minimum", "maximum", "default", "title", "minItems", "maxItems", "minLength", "maxLength", "pattern"}
CHUNK_CHARS = 24
VLLM_NO_TOOLS = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'


@dataclass(frozen=True)
class Failure:
    """A scripted error reply: the hosted API's status and body."""

    status: int
    body: dict
    headers: dict = field(default_factory=dict)


def openai_error(status: int, message: str, code: str | None, kind: str = "invalid_request_error",
                 param: str | None = None) -> Failure:
    return Failure(status, {"error": {"message": message, "type": kind, "param": param, "code": code}},
                   {"retry-after-ms": "10"} if status == 429 else {})


RATE_LIMITED = openai_error(429, "Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): "
                            "Limit 30000, Used 29000, Requested 2000. Please try again in 2s.",
                            "rate_limit_exceeded", kind="tokens")


@dataclass(frozen=True)
class Slow:
    """A scripted message streamed with `pause_s` before each chunk (or before the whole reply)."""

    message: dict
    pause_s: float


class RequestRefused(Exception):
    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.body)
        self.failure = failure


def refuse(message: str, param: str | None = None, code: str | None = None) -> RequestRefused:
    return RequestRefused(openai_error(400, message, code, param=param))


class ScriptedEndpoint:
    """POST /v1/chat/completions answers with the next scripted item; `requests` records every
    request body, `refusals` every error answered (status and body), `usages` the tokens counted."""

    def __init__(self, replies: list, refuse_tools: bool = False, refuse_stream: bool = False,
                 context_tokens: int | None = None, models: set[str] | None = None,
                 api_keys: set[str] | None = None, ignore_stream: bool = False) -> None:
        self.replies, self.refuse_tools, self.refuse_stream = list(replies), refuse_tools, refuse_stream
        self.ignore_stream = ignore_stream  # answer `stream: true` with a whole JSON reply, as some servers do
        self.context_tokens, self.models, self.api_keys = context_tokens, models, api_keys
        self.requests: list[dict] = []
        self.refusals: list[tuple[int, dict]] = []
        self.usages: list[int] = []
        self.server = make_server("127.0.0.1", 0, self._app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @Request.application
    def _app(self, request: Request) -> Response:
        body = json.loads(request.get_data())
        self.requests.append(body)
        try:
            self._check(request, body)
            item = self.replies.pop(0)
            if isinstance(item, Failure):
                raise RequestRefused(item)
        except RequestRefused as refused:
            failure = refused.failure
            self.refusals.append((failure.status, failure.body))
            return Response(json.dumps(failure.body), status=failure.status, headers=failure.headers,
                            content_type="application/json")
        message, pause_s = (item.message, item.pause_s) if isinstance(item, Slow) else (item, 0.0)
        usage = self._usage(body, message)
        if body.get("stream") and not self.ignore_stream:
            include = bool((body.get("stream_options") or {}).get("include_usage"))
            return Response(_sse(body["model"], message, usage if include else None, pause_s),
                            content_type="text/event-stream")
        time.sleep(pause_s)
        reply = {"id": f"c{len(self.requests)}", "object": "chat.completion", "created": 0, "model": body["model"],
                 "choices": [{"index": 0, "message": {"role": "assistant", "content": None, **message},
                              "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
                 "usage": usage}
        return Response(json.dumps(reply), content_type="application/json")

    def _check(self, request: Request, body: dict) -> None:
        key = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not key or (self.api_keys is not None and key not in self.api_keys):
            raise RequestRefused(openai_error(401, f"Incorrect API key provided: {key[:6]}****. You can find your "
                                              "API key at https://platform.openai.com/account/api-keys.",
                                              "invalid_api_key"))
        if self.models is not None and body.get("model") not in self.models:
            raise RequestRefused(openai_error(404, f"The model `{body.get('model')}` does not exist or you do not "
                                              "have access to it.", "model_not_found"))
        unknown = sorted(set(body) - PARAMETERS)
        if unknown:
            raise refuse(f"Unrecognized request argument supplied: {unknown[0]}")
        if "stream_options" in body and not body.get("stream"):
            raise refuse("The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options")
        if self.refuse_stream and body.get("stream"):
            raise refuse("stream is not supported by this endpoint", "stream")
        if "tools" in body:
            if self.refuse_tools:
                raise RequestRefused(Failure(400, {"object": "error", "message": VLLM_NO_TOOLS,
                                                   "type": "BadRequestError", "param": None, "code": 400}))
            check_tools(body["tools"])
        check_messages(body.get("messages"))
        if self.context_tokens is not None:
            wanted = prompt_tokens(body) + int(body.get("max_tokens") or body.get("max_completion_tokens") or 0)
            if wanted > self.context_tokens:
                raise refuse(f"This model's maximum context length is {self.context_tokens} tokens. However, your "
                             f"messages resulted in {wanted} tokens. Please reduce the length of the messages.",
                             "messages", "context_length_exceeded")

    def _usage(self, body: dict, message: dict) -> dict:
        prompt = prompt_tokens(body)
        completion = (len(message.get("content") or "") + len(json.dumps(message.get("tool_calls") or []))) // 4 + 1
        self.usages.append(prompt + completion)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def close(self) -> None:
        self.server.shutdown()


def prompt_tokens(body: dict) -> int:
    """Characters / 4: messages' content and tool calls, and the tool schemas."""
    chars = sum(len(m.get("content") or "") + len(json.dumps(m.get("tool_calls") or [])) for m in body["messages"])
    return (chars + len(json.dumps(body.get("tools") or []))) // 4 + 1


def check_messages(messages) -> None:
    if not isinstance(messages, list) or not messages:
        raise refuse("[] is too short - 'messages'", "messages")
    open_calls: list[str] = []
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in ROLES:
            raise refuse(f"Invalid value: '{role}'. Supported values are: 'system', 'assistant', 'user', 'tool', "
                         "and 'developer'.", f"messages[{i}].role")
        content = message.get("content")
        if role == "tool":
            if message.get("tool_call_id") not in open_calls:
                raise refuse("Invalid parameter: messages with role 'tool' must be a response to a preceeding "
                             "message with 'tool_calls'.", f"messages.[{i}].role")
            open_calls.remove(message["tool_call_id"])
        elif open_calls:
            raise refuse("An assistant message with 'tool_calls' must be followed by tool messages responding to "
                         f"each 'tool_call_id'. The following tool_call_ids did not have response messages: "
                         f"{', '.join(open_calls)}", f"messages.[{i}].role")
        if not isinstance(content, str) and not (role == "assistant" and content is None and message.get("tool_calls")):
            raise refuse(f"Invalid type for 'messages[{i}].content': expected a string, but got "
                         f"{type(content).__name__}.", f"messages[{i}].content")
        if role == "assistant" and message.get("tool_calls"):
            open_calls = [_check_call(call, i) for call in message["tool_calls"]]
    if open_calls:
        raise refuse("An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                     f"'tool_call_id'. The following tool_call_ids did not have response messages: "
                     f"{', '.join(open_calls)}", f"messages.[{len(messages)}].role")


def _check_call(call: dict, i: int) -> str:
    function = call.get("function") or {}
    if call.get("type") != "function" or not call.get("id") or not isinstance(function.get("arguments"), str):
        raise refuse(f"Invalid 'messages[{i}].tool_calls': each needs an id, type 'function' and string arguments.",
                     f"messages[{i}].tool_calls")
    try:
        json.loads(function["arguments"])
    except json.JSONDecodeError:
        raise refuse(f"Invalid 'messages[{i}].tool_calls': arguments are not valid JSON.",
                     f"messages[{i}].tool_calls") from None
    return call["id"]


def check_tools(tools) -> None:
    for i, tool in enumerate(tools):
        function = tool.get("function") or {}
        name = function.get("name", "")
        if tool.get("type") != "function" or not re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", name):
            raise refuse(f"Invalid 'tools[{i}]': a function with a name of [a-zA-Z0-9_-]{{1,64}}.", f"tools[{i}]")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if parameters.get("type") != "object":
            raise refuse(f"Invalid schema for function '{name}': schema must be a JSON Schema of 'type: \"object\"', "
                         f"got 'type: \"{parameters.get('type')}\"'.", f"tools[{i}].function.parameters",
                         "invalid_function_parameters")
        problem = schema_problem(parameters, ())
        if problem:
            raise refuse(f"Invalid schema for function '{name}': {problem}", f"tools[{i}].function.parameters",
                         "invalid_function_parameters")


def schema_problem(schema, path: tuple) -> str | None:
    """Why `schema` is not a JSON Schema the API takes (None when it is)."""
    where = f"In context={path!r}, "
    if not isinstance(schema, dict):
        return where + "schema must be an object."
    unknown = set(schema) - KEYWORDS
    if unknown:
        return where + f"unknown keyword {sorted(unknown)[0]!r}."
    kinds = schema.get("type")
    for kind in kinds if isinstance(kinds, list) else [kinds] if kinds is not None else []:
        if kind not in TYPES:
            return where + f"{kind!r} is not a valid type."
    if "anyOf" in schema:
        if not isinstance(schema["anyOf"], list) or not schema["anyOf"]:
            return where + "anyOf must be a non-empty array."
        for n, option in enumerate(schema["anyOf"]):
            found = schema_problem(option, (*path, "anyOf", n))
            if found:
                return found
    if kinds == "array" or (isinstance(kinds, list) and "array" in kinds):
        if "items" not in schema:
            return where + "array schema missing items."
        found = schema_problem(schema["items"], (*path, "items"))
        if found:
            return found
    properties = schema.get("properties", {})
    for name, sub in properties.items():
        found = schema_problem(sub, (*path, "properties", name))
        if found:
            return found
    for name in schema.get("required", []):
        if name not in properties:
            return where + f"'required' names {name!r}, which is not in 'properties'."
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        return schema_problem(extra, (*path, "additionalProperties"))
    return None


def _sse(model: str, message: dict, usage: dict | None, pause_s: float):
    """The reply as OpenAI streams it."""
    def chunk(delta: dict | None, finish: str | None = None, with_usage: dict | None = None) -> str:
        data = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": model,
                "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]}
        if usage is not None:
            data["usage"] = with_usage
        time.sleep(pause_s)
        return f"data: {json.dumps(data)}\n\n"

    yield chunk({"role": "assistant", "content": ""})
    content = message.get("content") or ""
    for start in range(0, len(content), CHUNK_CHARS):
        yield chunk({"content": content[start:start + CHUNK_CHARS]})
    for index, call in enumerate(message.get("tool_calls") or []):
        yield chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                     "function": {"name": call["function"]["name"], "arguments": ""}}]})
        arguments = call["function"]["arguments"]
        for start in range(0, len(arguments), CHUNK_CHARS):
            piece = arguments[start:start + CHUNK_CHARS]
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    yield chunk({}, "tool_calls" if message.get("tool_calls") else "stop")
    if usage is not None:
        yield chunk(None, with_usage=usage)
    yield "data: [DONE]\n\n"


def tool_call(name: str, arguments: dict, call_id: str = "call_1") -> dict:
    return {"content": None, "tool_calls": [{"id": call_id, "type": "function",
                                              "function": {"name": name, "arguments": json.dumps(arguments)}}]}

"""The model behind an LLM writer: any OpenAI-compatible chat endpoint (OpenAI, vLLM, Ollama, a
gateway). Tool calls where the endpoint takes them; fenced files in plain text where it does not."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from services.evaluator.languages import writer_languages
from shared.errors import RetryableError

log = logging.getLogger(__name__)

SOLUTION_SCHEMA = {
    "type": "object",
    "properties": {
        "language": {"type": "string", "enum": writer_languages()},  # the evaluator's registry
        "entry_point": {"type": "string", "description": "<file>::<function>, e.g. launch.py::run"},
        "files": {"type": "array", "items": {
            "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"]}},
        "tunables": {"type": "object", "additionalProperties": {"type": "array"}},
        "destination_passing_style": {"type": "boolean"},
    },
    "required": ["language", "files"],
}
TOOLS = [
    {"type": "function", "function": {"name": "evaluate", "description": "Evaluate a solution on every workload.",
                                      "parameters": SOLUTION_SCHEMA}},
    {"type": "function", "function": {"name": "submit", "description": "Finish: the best passing attempt counts.",
                                      "parameters": {"type": "object", "properties": {}}}},
]


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Reply:
    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    tokens: int = 0
    raw: dict[str, Any] = field(default_factory=dict)  # the assistant message, to send back


class ChatModel:
    """`complete(messages)` -> Reply. Falls back to plain text for good once the endpoint refuses tools."""

    def __init__(self, model: str, base_url: str | None, api_key: str, timeout_s: float = 300.0) -> None:
        import openai

        self.model = model
        self._openai = openai
        self._client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=2)
        self.tools_supported = True

    def complete(self, messages: list[dict[str, Any]]) -> Reply:
        openai = self._openai
        try:
            if self.tools_supported:
                try:
                    response = self._client.chat.completions.create(model=self.model, messages=messages, tools=TOOLS)
                except openai.BadRequestError as error:
                    log.info("endpoint refused tools (%s); using fenced files", error)
                    self.tools_supported = False
                    return self.complete(messages)
            else:
                response = self._client.chat.completions.create(model=self.model, messages=messages)
        except (openai.RateLimitError, openai.APIConnectionError, openai.APITimeoutError,
                openai.InternalServerError) as error:
            raise RetryableError(f"LLM endpoint: {error}") from error
        return _reply(response)


def _reply(response: Any) -> Reply:
    message = response.choices[0].message
    calls = []
    for call in message.tool_calls or []:
        try:
            arguments = json.loads(call.function.arguments or "{}")
        except json.JSONDecodeError:
            arguments = {"_invalid_json": call.function.arguments}
        calls.append(ToolCall(call.id, call.function.name, arguments))
    raw: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
    if message.tool_calls:
        raw["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.function.name, "arguments": c.function.arguments}}
                             for c in message.tool_calls]
    usage = getattr(response, "usage", None)
    tokens = int(getattr(usage, "total_tokens", 0) or 0)
    return Reply(message.content or "", calls, tokens, raw)

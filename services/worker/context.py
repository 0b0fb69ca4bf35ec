"""Fitting a session's history into the model's context.

A request is the head (the protocol as system message, the brief as first user message: the
problem and the current best) and the turns, each an assistant message with its answers (its tool
calls' `tool` messages, or the user message that answered its text). The head is always sent
whole. When the whole history does not fit `budget_tokens`, turns lose detail oldest first: a
turn becomes one line (what it did, the first lines of what it got) in a block appended to the
brief, then that line is dropped. The last turn and the latest turn whose solution passed (the one
the model is improving) are kept whole longest; the last turn always. A turn is shortened as a
whole, so every tool call sent is answered and no tool message is left without its call.

Tokens are estimated from characters: `chars_per_token` starts at 3 (code is denser than prose's
4) and the agent corrects it from the prompt tokens the endpoint reports.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

START_CHARS_PER_TOKEN = 3.0
MESSAGE_OVERHEAD_CHARS = 16  # role and framing, per message
LINE_CHARS = 240
EARLIER = "## Earlier turns (shortened to fit the context; the turns after them are shown whole)"


@dataclass
class Turn:
    number: int
    messages: list[dict[str, Any]]
    summary: str  # one line: what the turn did -> what it got
    passed: bool = False  # its solution PASSED: kept whole while older turns can go
    size_chars: int = field(init=False)

    def __post_init__(self) -> None:
        self.size_chars = sum(message_chars(m) for m in self.messages)

    @property
    def line(self) -> str:
        return f"- turn {self.number}: {self.summary}"[:LINE_CHARS]


def message_chars(message: dict[str, Any]) -> int:
    chars = len(message.get("content") or "") + MESSAGE_OVERHEAD_CHARS
    if message.get("tool_calls"):
        chars += len(json.dumps(message["tool_calls"]))
    return chars


def estimate_tokens(chars: int, chars_per_token: float) -> int:
    return int(chars / chars_per_token) + 1


def fit(system: str, brief: str, turns: list[Turn], budget_tokens: int, chars_per_token: float,
        overhead_chars: int = 0) -> list[dict[str, Any]]:
    """The messages to send: as much of the history as fits `budget_tokens` (see the module's
    docstring). `overhead_chars`: what the request carries beside its messages (tool schemas)."""
    budget_chars = int(budget_tokens * chars_per_token) - overhead_chars
    budget_chars -= len(system) + len(brief) + 2 * MESSAGE_OVERHEAD_CHARS + len(EARLIER) + 2
    state = ["whole"] * len(turns)
    for turn_index in _shortening_order(turns):
        if _chars(turns, state) <= budget_chars:
            break
        state[turn_index] = "line"
    for turn_index in _shortening_order(turns):
        if _chars(turns, state) <= budget_chars:
            break
        state[turn_index] = "dropped"
    lines = [t.line for t, s in zip(turns, state) if s == "line"]
    dropped = state.count("dropped")
    if dropped:
        lines.insert(0, f"- ({dropped} earlier turns left out)")
    head = brief + (f"\n\n{EARLIER}\n" + "\n".join(lines) if lines else "")
    messages = [{"role": "system", "content": system}, {"role": "user", "content": head}]
    for turn, kept in zip(turns, state):
        if kept == "whole":
            messages.extend(turn.messages)
    return messages


def _shortening_order(turns: list[Turn]) -> list[int]:
    """Oldest first; the latest passing turn after every other; never the last turn."""
    if not turns:
        return []
    last = len(turns) - 1
    passing = [i for i, t in enumerate(turns[:last]) if t.passed]
    keep = passing[-1] if passing else None
    order = [i for i in range(last) if i != keep]
    return order + ([keep] if keep is not None else [])


def _chars(turns: list[Turn], state: list[str]) -> int:
    total = 0
    for turn, kept in zip(turns, state):
        if kept == "whole":
            total += turn.size_chars
        elif kept == "line":
            total += len(turn.line) + 1
    return total + (40 if "dropped" in state else 0)

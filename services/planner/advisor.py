"""The optional LLM planner (campaign policy `llm`): a model reads the campaign's metrics table and
proposes which problems get the next assignments, best first, with guidance for each writer.

The model is asked from the planner's sweeper thread, never from a tick (a tick holds the campaign's
lock, and an LLM turn takes seconds), at most every `every_s` per campaign; its latest valid answer
is kept in memory. The policy checks every proposal: a problem that is not in the campaign, is
retired or is named twice is dropped, guidance is cut to `MAX_GUIDANCE` characters, and the slots
the advice does not fill (all of them when there is no advice, it is too old, or the endpoint is
down or answered nonsense) go to the default policy (`headroom_ucb`).

The endpoint is any OpenAI-compatible one (`OPENAI_API_KEY`, `OPENAI_BASE_URL`, `KERNELSWARM_MODEL`),
as for the writers. The answer is one JSON object, alone or in a fenced block:

    {"assignments": [{"problem_id": 7, "guidance": "..."}, ...]}
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from services.planner.policy import (
    CampaignMeans, Plan, PolicyConfig, ProblemStats, UcbIndex, choose, retired, DEFAULT_POLICY,
)
from shared.db import Database, ProblemRow

log = logging.getLogger(__name__)

MAX_GUIDANCE = 500
MAX_PROBLEMS_SHOWN = 200  # the table's rows, best UCB index first; the rest are summarised
SYSTEM = (
    "You plan the work of a swarm of agents that write faster GPU kernels. Each row of the table is "
    "a problem of the campaign with what its attempts achieved so far. SOL is the best measured "
    "speed-of-light score (0.5: an optimized PyTorch baseline, 1.0: the hardware's limit); speedup "
    "is over the eager PyTorch reference; stall counts finished attempts since the last real gain; "
    "cost is GPU-seconds (and tokens) per attempt; ucb is the default policy's index (higher: more "
    "expected gain per unit of cost). Choose the problems that should get the next assignments, "
    "most promising first, and give each a short guidance for its writer (what to try, what to "
    'avoid). Answer with one JSON object only: {"assignments": [{"problem_id": <int>, "guidance": '
    '<string>}, ...]}.'
)


@dataclass(frozen=True)
class Advice:
    order: tuple[int, ...]  # problem ids, most promising first
    guidance: dict[int, str]
    received_at: float  # time.monotonic()
    dropped: int = 0  # proposals the check refused


def metrics_table(problems: Sequence[ProblemStats], names: dict[int, str], config: PolicyConfig) -> str:
    """The campaign as the model sees it: one Markdown row per open problem."""
    index = UcbIndex(CampaignMeans.of(problems, config), config)
    open_problems = [p for p in problems if not retired(p, config)]
    ranked = sorted(open_problems, key=lambda p: -index(p))
    lines = ["| problem_id | name | attempts | failed | best SOL | best speedup | stall | cost/attempt | "
             "in flight | ucb |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p in ranked[:MAX_PROBLEMS_SHOWN]:
        cost = p.cost(config) / p.attempts if p.attempts else None
        lines.append(f"| {p.problem_id} | {names.get(p.problem_id, '?')} | {p.attempts} | {p.failures} | "
                     f"{_fmt(p.best_sol)} | {_fmt(p.best_speedup)} | {p.stall} | {_fmt(cost)} | {p.in_flight} | "
                     f"{index(p):.4g} |")
    hidden = len(ranked) - MAX_PROBLEMS_SHOWN
    if hidden > 0:
        lines.append(f"\n{hidden} more open problems with lower ucb are not shown.")
    lines.append(f"\n{len(problems) - len(open_problems)} problems are retired (reached SOL or stalled) and "
                 "cannot be assigned.")
    return "\n".join(lines)


def parse_advice(text: str, problems: Sequence[ProblemStats], config: PolicyConfig) -> Advice:
    """The model's answer, checked. Raises ValueError when nothing in it can be used."""
    data = _first_json_object(text)
    items = data.get("assignments") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise ValueError('no "assignments" list in the answer')
    allowed = {p.problem_id for p in problems if not retired(p, config)}
    order: list[int] = []
    guidance: dict[int, str] = {}
    dropped = 0
    for item in items:
        problem_id = item.get("problem_id") if isinstance(item, dict) else None
        if not isinstance(problem_id, int) or isinstance(problem_id, bool) or problem_id not in allowed \
                or problem_id in guidance:
            dropped += 1
            continue
        order.append(problem_id)
        text_ = item.get("guidance")
        guidance[problem_id] = text_.strip()[:MAX_GUIDANCE] if isinstance(text_, str) else ""
    if not order:
        raise ValueError(f"none of the {len(items)} proposed assignments names an open problem of the campaign")
    return Advice(tuple(order), guidance, time.monotonic(), dropped)


def choose_advised(advice: Advice | None, problems: Sequence[ProblemStats], slots: int, per_assignment: int,
                   config: PolicyConfig, cursor: int = 0) -> Plan:
    """The advised problems first, in the model's order (each once per tick), then the default
    policy's choice for the slots left."""
    default = choose(DEFAULT_POLICY, problems, slots, per_assignment, config, cursor)
    if advice is None:
        return default
    open_ids = {p.problem_id for p in problems} - default.retired
    advised = tuple(p for p in advice.order if p in open_ids)[:slots]
    filler = choose(DEFAULT_POLICY, problems, slots - len(advised), per_assignment, config, cursor).problem_ids
    return Plan(advised + filler, default.retired, cursor)


class Advisor:
    """The planner process's LLM advice, per campaign."""

    def __init__(self, model: str, base_url: str | None, api_key: str, every_s: float = 60.0,
                 max_age_s: float = 600.0, timeout_s: float = 120.0, client: Any = None) -> None:
        if client is None:
            import openai

            client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=2)
        self.model, self.client, self.every_s, self.max_age_s = model, client, every_s, max_age_s
        self._advice: dict[int, Advice] = {}
        self._asked: dict[int, float] = {}
        self._lock = threading.Lock()

    def latest(self, campaign_id: int) -> Advice | None:
        """The last valid advice, unless older than `max_age_s` (then the default policy plans)."""
        with self._lock:
            advice = self._advice.get(campaign_id)
        if advice is None or time.monotonic() - advice.received_at > self.max_age_s:
            return None
        return advice

    def due(self, campaign_id: int) -> bool:
        with self._lock:
            return time.monotonic() - self._asked.get(campaign_id, float("-inf")) >= self.every_s

    def refresh(self, db: Database, campaign_id: int, config: PolicyConfig) -> Advice | None:
        """Ask the model about the campaign now; keep its answer if it passes the check. Any failure
        (endpoint down, nonsense) is logged and leaves the previous advice to age out."""
        from services.planner.state import read_state

        with self._lock:
            self._asked[campaign_id] = time.monotonic()
        with db.session() as session:
            state = read_state(session, campaign_id, config, count_recorded=False)
            ids = [p.problem_id for p in state.problems]
            names = dict(session.execute(select(ProblemRow.id, ProblemRow.name).where(ProblemRow.id.in_(ids))).all())
        prompt = metrics_table(state.problems, names, config)
        try:
            response = self.client.chat.completions.create(model=self.model, messages=[
                {"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}])
            advice = parse_advice(response.choices[0].message.content or "", state.problems, config)
        except Exception as error:  # the endpoint or the answer: the default policy goes on planning
            log.warning("campaign=%s LLM planner gave no usable advice: %s", campaign_id, error)
            return None
        with self._lock:
            self._advice[campaign_id] = advice
        log.info("campaign=%s LLM planner advises %s (%d proposals dropped)", campaign_id,
                 list(advice.order[:10]), advice.dropped)
        return advice


def _first_json_object(text: str) -> Any:
    fenced = re.search(r"```(?:json)?\s*(\{.*?\})\s*```", text, re.DOTALL)
    candidates = [fenced.group(1)] if fenced else []
    start = text.find("{")
    if start >= 0:
        candidates.append(text[start:text.rfind("}") + 1])
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    raise ValueError("the answer holds no JSON object")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"

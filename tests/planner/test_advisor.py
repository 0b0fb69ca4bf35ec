"""The optional LLM planner (policy `llm`): the model sees the metrics table, its proposals are
checked, and anything missing or wrong falls back on the default policy. The model is a scripted
OpenAI-compatible server driven by the real openai client."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from plannerkit import T0, Attempts, WriteQueue, add_problems, assignments
from services.planner.advisor import MAX_GUIDANCE, Advisor, choose_advised, metrics_table, parse_advice
from services.planner.campaign import create_campaign
from services.planner.policy import DEFAULT_POLICY, PolicyConfig, ProblemStats, choose
from services.planner.sweep import Sweeper
from services.planner.tick import PlannerConfig, tick
from shared.db import AssignmentRow
from tests.worker.fake_openai import ScriptedEndpoint

CONFIG = PolicyConfig()


def stats(*ids: int, retired: tuple[int, ...] = ()) -> list[ProblemStats]:
    """Open problems with a little history; `retired` ones at S = 0.97."""
    return [ProblemStats(problem_id=i, position=k, attempts=4, recent_attempts=4, best_speedup=1.5,
                         best_sol=0.97 if i in retired else 0.6, gpu_s=4.0) for k, i in enumerate(ids)]


def answer(*items: dict, fenced: bool = True) -> str:
    text = json.dumps({"assignments": list(items)})
    return f"Here is the plan.\n```json\n{text}\n```" if fenced else text


def test_the_check_keeps_open_problems_of_the_campaign_once_each():
    problems = stats(1, 2, 3, retired=(3,))
    advice = parse_advice(answer({"problem_id": 2, "guidance": "try vectorised loads " * 100},
                                 {"problem_id": 3, "guidance": "retired"},  # retired: dropped
                                 {"problem_id": 99, "guidance": "not in the campaign"},
                                 {"problem_id": 2, "guidance": "twice"},
                                 {"problem_id": True}, {"problem_id": "1"},
                                 {"problem_id": 1}), problems, CONFIG)
    assert advice.order == (2, 1) and advice.dropped == 5
    assert len(advice.guidance[2]) == MAX_GUIDANCE and advice.guidance[1] == ""


@pytest.mark.parametrize("text", ["I think problem 2.", '{"plan": [2]}', answer({"problem_id": 99}),
                                  '{"assignments": "2"}', "```json\n{broken\n```"])
def test_an_answer_with_nothing_usable_is_refused(text):
    with pytest.raises(ValueError):
        parse_advice(text, stats(1, 2), CONFIG)


def test_advised_problems_come_first_and_the_default_policy_fills_the_rest():
    problems = stats(1, 2, 3, 4)
    advice = parse_advice(answer({"problem_id": 4}, fenced=False), problems, CONFIG)
    plan = choose_advised(advice, problems, 3, 2, CONFIG)
    assert plan.problem_ids[0] == 4 and len(plan.problem_ids) == 3
    assert plan.problem_ids[1:] == choose(DEFAULT_POLICY, problems, 2, 2, CONFIG).problem_ids
    assert choose_advised(None, problems, 3, 2, CONFIG) == choose(DEFAULT_POLICY, problems, 3, 2, CONFIG)


def test_the_table_shows_open_problems_and_counts_the_retired():
    table = metrics_table(stats(1, 2, retired=(2,)), {1: "rmsnorm", 2: "gemm"}, CONFIG)
    assert "| 1 | rmsnorm | 4 | 0 | 0.6 | 1.5 |" in table and "gemm" not in table
    assert "1 problems are retired" in table


def test_a_campaign_with_policy_llm_follows_the_models_advice(db):
    ids = add_problems(db, 4)
    campaign_id = create_campaign(db, "llm", ids, "cpu", 2, 2, policy="llm")
    attempts = Attempts(db)
    for problem_id in ids:
        attempts.add(problem_id, campaign_id, "PASSED", speedup=1.2, minute=1)
    endpoint = ScriptedEndpoint([{"content": answer({"problem_id": ids[3], "guidance": "fuse the epilogue"},
                                                    {"problem_id": ids[2]})}])
    try:
        advisor = Advisor("planner-model", endpoint.url, "sk-test")
        assert advisor.refresh(db, campaign_id, CONFIG) is not None
        sent = WriteQueue(db)
        tick(db, campaign_id, sent, PlannerConfig(advisor=advisor), now=T0)
    finally:
        endpoint.close()
    assert sent.problems == [ids[3], ids[2]]
    rows = {r.problem_id: r for r in assignments(db, campaign_id)}
    assert rows[ids[3]].guidance.startswith("Planner: fuse the epilogue")
    request = endpoint.requests[0]
    assert request["model"] == "planner-model" and "| problem_id |" in request["messages"][1]["content"]


def test_without_an_answer_the_default_policy_plans(db):
    ids = add_problems(db, 3)
    campaign_id = create_campaign(db, "llm", ids, "cpu", 2, 2, policy="llm")
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    advisor = Advisor("planner-model", f"http://127.0.0.1:{port}/v1", "sk-test", timeout_s=5)
    assert advisor.refresh(db, campaign_id, CONFIG) is None and advisor.latest(campaign_id) is None
    sent = WriteQueue(db)
    created = tick(db, campaign_id, sent, PlannerConfig(advisor=advisor), now=T0)
    assert len(created) == 2  # the writers are not left idle
    with db.session() as session:
        assert all(session.get(AssignmentRow, a).guidance is None or "Planner:" not in
                   session.get(AssignmentRow, a).guidance for a in created)


class StubClient:
    """The part of the openai client the advisor uses, answering from a list."""

    def __init__(self, replies: list[str]) -> None:
        self.replies, self.calls = list(replies), 0
        self.chat = self
        self.completions = self

    def create(self, model: str, messages: list[dict]):
        self.calls += 1
        message = type("Message", (), {"content": self.replies.pop(0)})
        return type("Response", (), {"choices": [type("Choice", (), {"message": message})]})


def test_the_sweeper_asks_for_advice_when_due_and_ticks_with_it(db):
    ids = add_problems(db, 3)
    advised = create_campaign(db, "llm", ids, "cpu", 2, 2, policy="llm")
    create_campaign(db, "ucb", add_problems(db, 2, prefix="q"), "cpu", 2, 2)  # never asked about
    client = StubClient([answer({"problem_id": ids[1], "guidance": "tile by 128"})])
    advisor = Advisor("m", None, "sk-test", every_s=3600, client=client)
    ticks: list[int] = []
    done = threading.Event()

    def send_tick(campaign_id: int) -> None:
        ticks.append(campaign_id)
        if client.calls:
            done.set()

    sweeper = Sweeper(lambda: db, WriteQueue(db), send_tick, PlannerConfig(sweep_every_s=0.01, advisor=advisor))
    sweeper.start()
    assert done.wait(30)
    sweeper.stop()
    assert client.calls == 1  # due once an hour: asked once, whatever the number of sweeps
    assert advisor.latest(advised).order == (ids[1],) and advised in ticks

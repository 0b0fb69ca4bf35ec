"""The whole loop on one machine: real redis-server, real Celery workers, real child processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from sqlalchemy import func, select

from kernelswarm.launcher import CUT_OFF_WAIT_S, RedisServer, Services, free_port
from kernelswarm.up import cpu_sized
from services.planner.campaign import create_campaign, stop_campaign
from services.web import create_app
from shared.celery_app import PLAN_TICK, make_celery
from shared.db import AssignmentRow, AttemptRow, CampaignProblemRow, Database, ProblemRow, TraceRow
from shared.repository import upsert_problem
from shared.schema import Trace, load_problem
from shared.schema.problem import find_problems
from shared.settings import Settings
from shared.store import open_store

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
PROBLEMS = REPO / "problems"
DEADLINE_S = 420
UP_DEADLINE_S = 300
SMALL = ("llama31_8b_gemm_o_proj", "llama31_8b_rmsnorm", "llama31_8b_swiglu")  # the CPU-sized three
SMALL_WORKLOADS = 4


@pytest.fixture
def small_library(tmp_path) -> Path:
    """Three of the shipped problems with their first (smallest) SMALL_WORKLOADS workloads, so that a
    CPU campaign reaches every one within a minute."""
    folder = tmp_path / "problems"
    for name in SMALL:
        shutil.copytree(PROBLEMS / name, folder / name)
        workloads = folder / name / "workload.jsonl"
        workloads.write_text("".join(workloads.read_text().splitlines(keepends=True)[:SMALL_WORKLOADS]))
    return folder


@pytest.fixture
def redis_url(tmp_path):
    server = RedisServer(tmp_path / "redis")
    yield server.url
    server.stop()


def fast_settings(tmp_path: Path, problems_dir: Path = PROBLEMS, **extra) -> Settings:
    return Settings(home=tmp_path / "home", problems_dir=problems_dir, writers=3,
                    correctness_rounds=2, timing_sets=1, warmup_runs=1, timing_runs=5, timing_budget_s=0.3,
                    attempt_timeout_s=120, **extra)


def problems_with_best(db: Database, campaign_id: int) -> set[str]:
    """Problems for which the planner has recorded a best (PASSED) attempt."""
    with db.session() as session:
        return set(session.scalars(
            select(ProblemRow.name).join(CampaignProblemRow, CampaignProblemRow.problem_id == ProblemRow.id)
            .join(AttemptRow, AttemptRow.id == CampaignProblemRow.best_attempt_id)
            .where(CampaignProblemRow.campaign_id == campaign_id, AttemptRow.status == "PASSED")))


def test_campaign_reaches_passed_attempts_in_db_and_api(tmp_path, redis_url, small_library):
    settings = fast_settings(tmp_path, small_library, redis_url=redis_url, attempts_per_assignment=1)
    problems = [load_problem(p) for p in find_problems([small_library])]
    assert len(problems) == 3
    db = Database(settings.db_url)
    with db.session() as session:
        ids = [upsert_problem(session, p).id for p in problems]
    campaign_id = create_campaign(db, "e2e", ids, "cpu", settings.writers, settings.attempts_per_assignment)
    services = Services(settings, tmp_path / "logs")
    services.start()
    try:
        make_celery(settings).send_task(PLAN_TICK, args=[campaign_id])
        deadline = time.monotonic() + DEADLINE_S
        while problems_with_best(db, campaign_id) != {p.name for p in problems}:
            dead = services.dead()
            logs = {p.name: p.read_text()[-3000:] for p in (tmp_path / "logs").glob("*.log")}
            assert not dead, f"services died: {dead}\n{logs}"
            assert time.monotonic() < deadline, f"no PASSED attempt on every problem in time\n{logs}"
            time.sleep(1)
    finally:
        stop_campaign(db, campaign_id)
        services.stop(wait_s=CUT_OFF_WAIT_S)  # what is checked below is recorded: no warm shutdown waited for

    store = open_store(settings)
    with db.session() as session:
        attempts = session.scalars(select(AttemptRow).where(AttemptRow.campaign_id == campaign_id,
                                                            AttemptRow.status == "PASSED")).all()
        for attempt in attempts:
            assert attempt.speedup > 0 and attempt.latency_ms > 0
            assert attempt.workloads_passed == attempt.workloads_total == SMALL_WORKLOADS
            assert store.exists(attempt.solution_hash)
            traces = [Trace.model_validate_json(line) for line in store.get(attempt.traces_hash).splitlines()]
            assert {t.evaluation.status.value for t in traces} == {"PASSED"}
            rows = session.scalar(select(func.count()).select_from(TraceRow).where(TraceRow.attempt_id == attempt.id))
            assert rows == attempt.workloads_total
        assert session.scalar(select(func.count()).select_from(AssignmentRow)
                              .where(AssignmentRow.campaign_id == campaign_id)) >= 3

    client = create_app(settings, db).test_client()
    response = client.get(f"/api/leaderboard?campaign={campaign_id}")
    assert response.status_code == 200
    board = response.get_json()
    assert {p["name"] for p in board["problems"]} == {p.name for p in problems}
    for entry in board["problems"]:
        assert entry["status"] == "PASSED"
        assert entry["speedup"] > 0 and entry["passed_attempts"] >= 1


@pytest.mark.database_agnostic("up's queries, run on PostgreSQL by tests/cli/test_up_campaign.py and "
                               "tests/cli/test_up_drain.py; the whole loop by the campaign test above")
def test_up_stops_by_itself_and_leaves_a_leaderboard(tmp_path, small_library):
    """On the small library and one problem too large for a CPU (so that what `up` still has in
    flight at the end finishes within its drain)."""
    shutil.copytree(PROBLEMS / "llama31_8b_embedding", small_library / "llama31_8b_embedding")
    settings_env = {
        "KERNELSWARM_HOME": str(tmp_path / "home"),
        "KERNELSWARM_PROBLEMS_DIR": str(small_library),
        "KERNELSWARM_TIMING_BUDGET_S": "0.3",
        "KERNELSWARM_CORRECTNESS_ROUNDS": "2",
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELSWARM_")} | settings_env
    cli = [sys.executable, "-m", "kernelswarm.cli"]
    try:
        up = subprocess.run([*cli, "up", "--device", "cpu", "--duration", "8", "--port", str(free_port())],
                            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as stuck:  # its services die with it; say what they were doing
        pytest.fail(f"`up` did not stop: {stuck.stderr}\n{_logs(tmp_path)}")
    assert up.returncode == 0, up.stderr[-4000:]
    assert "attempts:" in up.stderr  # progress was shown
    board = subprocess.run([*cli, "leaderboard", "--json"], env=env, cwd=tmp_path, capture_output=True,
                           text=True, timeout=60)
    assert board.returncode == 0, board.stderr
    names = {p["name"] for p in json.loads(board.stdout)["problems"]}
    kept, left_out = cpu_sized([load_problem(p) for p in find_problems([small_library])])
    assert names == {p.name for p in kept} == set(SMALL)
    assert left_out == ["llama31_8b_embedding"] and "leaving out 1 problems too large for it" in up.stderr


RMSNORM = """import torch


@torch.no_grad()
def run(hidden_states, weight, output):
    x = hidden_states.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-5)
    torch.mul(x.to(hidden_states.dtype), weight, out=output)
"""


class EveryTurnEndpoint:
    """An OpenAI-compatible chat server for a whole campaign: a request that ends with a tool's answer
    gets `submit`, any other gets `evaluate` with a correct RMSNorm. Counts the requests by model."""

    def __init__(self) -> None:
        from werkzeug.serving import make_server

        self.models: list[str] = []
        self.server = make_server("127.0.0.1", 0, self._app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _app(self, environ, start_response):
        from werkzeug.wrappers import Request, Response

        body = json.loads(Request(environ).get_data())
        self.models.append(body["model"])
        answered = body["messages"][-1]["role"] == "tool"
        call = ("submit", {}) if answered else ("evaluate", {"language": "pytorch", "files": [
            {"path": "main.py", "content": RMSNORM}]})
        message = {"role": "assistant", "content": None, "tool_calls": [{
            "id": f"call_{len(self.models)}", "type": "function",
            "function": {"name": call[0], "arguments": json.dumps(call[1])}}]}
        reply = {"id": f"c{len(self.models)}", "object": "chat.completion", "created": 0, "model": body["model"],
                 "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                 "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}}
        return Response(json.dumps(reply), content_type="application/json")(environ, start_response)

    def close(self) -> None:
        self.server.shutdown()


def _a_problem_passed(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/leaderboard", timeout=5) as response:
            board = json.loads(response.read())
    except (OSError, ValueError):
        return False  # not serving yet
    return any(entry["status"] == "PASSED" for entry in board["problems"])


def _logs(tmp_path: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                     for p in sorted([tmp_path / "up.log", *(tmp_path / "home" / "logs").glob("*.log")]) if p.exists())


@pytest.mark.database_agnostic("up's queries, run on PostgreSQL by tests/cli/test_up_campaign.py and "
                               "tests/cli/test_up_drain.py; the LLM writer's by tests/worker/test_llm_writer.py")
def test_up_with_an_openai_endpoint_records_the_models_attempts(tmp_path):
    """`kernelswarm up` with OPENAI_BASE_URL and a key: the writers are LLM agents, and the attempts
    they make carry the configured model as their author."""
    library = tmp_path / "problems"
    shutil.copytree(PROBLEMS / "llama31_8b_rmsnorm", library / "llama31_8b_rmsnorm")
    workloads = library / "llama31_8b_rmsnorm" / "workload.jsonl"
    workloads.write_text("".join(workloads.read_text().splitlines(keepends=True)[:SMALL_WORKLOADS]))
    endpoint = EveryTurnEndpoint()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KERNELSWARM_", "OPENAI_"))} | {
        "KERNELSWARM_HOME": str(tmp_path / "home"), "KERNELSWARM_PROBLEMS_DIR": str(library),
        "KERNELSWARM_TIMING_BUDGET_S": "0.3", "KERNELSWARM_CORRECTNESS_ROUNDS": "2",
        "KERNELSWARM_MODEL": "e2e-model", "OPENAI_API_KEY": "sk-e2e", "OPENAI_BASE_URL": endpoint.url}
    port = free_port()
    console = (tmp_path / "up.log").open("w+")
    up = subprocess.Popen([sys.executable, "-m", "kernelswarm.cli", "up", "--device", "cpu", "--port", str(port)],
                          env=env, cwd=tmp_path, stdout=console, stderr=subprocess.STDOUT, text=True)
    try:  # until a PASSED attempt is on the leaderboard (not a fixed time: a busy machine evaluates slowly)
        deadline = time.monotonic() + UP_DEADLINE_S
        while not _a_problem_passed(port):
            assert up.poll() is None, f"`up` ended by itself:\n{(tmp_path / 'up.log').read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"no PASSED attempt in time:\n{_logs(tmp_path)}"
            time.sleep(1)
        up.terminate()  # SIGTERM: `up` stops as on Ctrl-C
        up.wait(timeout=120)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        endpoint.close()
        console.seek(0)
        said = console.read()
        console.close()
    assert up.returncode == 0, said[-4000:]
    assert endpoint.models and set(endpoint.models) == {"e2e-model"}
    db = Database(f"sqlite:///{tmp_path / 'home' / 'kernelswarm.db'}")
    try:
        with db.session() as session:
            mine = session.scalars(select(AttemptRow).where(AttemptRow.model == "e2e-model")).all()
            statuses = [a.status for a in mine]
            hashes = [a.solution_hash for a in mine if a.status == "PASSED"]
    finally:
        db.dispose()
    assert "PASSED" in statuses, (statuses, said[-3000:])
    store = open_store(Settings(home=tmp_path / "home"))
    from shared.repository import get_solution
    assert get_solution(store, hashes[0]).author == "e2e-model"

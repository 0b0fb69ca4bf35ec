"""Kill the planner (SIGKILL) twice in the middle of a campaign and start it again, with a real
redis-server, the real planner and writer Celery workers and a fast fake evaluator: every assignment
is done exactly once (its attempts are exactly its budget), none is lost, none is made twice (the
attempts add up to the campaign's budget) and the campaign ends by itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from kernelswarm.launcher import RedisServer, settings_env
from services.planner.campaign import Budgets, create_campaign
from shared.celery_app import PLAN_TICK, make_celery
from shared.db import AssignmentRow, AttemptRow, CampaignProblemRow, CampaignRow, Database
from shared.repository import upsert_problem
from shared.schema import load_problem
from shared.settings import Settings

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
BUDGET, PER_ASSIGNMENT, WRITERS = 40, 2, 4
DEADLINE_S = 240


def write_problem(root: Path, name: str) -> Path:
    """A valid problem whose seed has 500 tunable values: the tuner never runs out."""
    folder = root / name
    (folder / "solutions").mkdir(parents=True)
    (folder / "definition.json").write_text(json.dumps({
        "name": name, "axes": {"n": {"type": "var"}},
        "inputs": {"x": {"shape": ["n"], "dtype": "float32"}}, "outputs": {"y": {"shape": ["n"], "dtype": "float32"}},
        "reference": "def run(x):\n    return x * 2\n"}))
    (folder / "workload.jsonl").write_text(json.dumps({"uuid": f"{name}-8", "axes": {"n": 8},
                                                       "inputs": {"x": {"type": "random"}}}) + "\n")
    (folder / "solutions" / "seed.json").write_text(json.dumps({
        "name": f"{name}_seed", "definition": name, "author": "tests",
        "spec": {"languages": ["pytorch"], "target_hardware": ["CPU"], "entry_point": "main.py::run",
                 "destination_passing_style": True, "tunables": {"UNROLL": list(range(500))}},
        "sources": [{"path": "main.py", "content": "def run(x, y):\n    y.copy_(x * 2)\n"}]}))
    return folder


class Worker:
    """One Celery worker process in its own session, logging to a file."""

    def __init__(self, name: str, app: str, options: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name, self.log = name, log_dir / f"{name}.log"
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", app, "worker", "-n", f"{name}@%h", "--without-gossip",
                 "--without-mingle", "-l", "INFO", *options],
                env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


def counts(db: Database, campaign_id: int) -> dict[str, int]:
    with db.session() as session:
        return dict(session.execute(select(AssignmentRow.status, func.count())
                                    .where(AssignmentRow.campaign_id == campaign_id)
                                    .group_by(AssignmentRow.status)).all())


def campaign_status(db: Database, campaign_id: int) -> str:
    with db.session() as session:
        return session.get(CampaignRow, campaign_id).status


def test_the_planner_killed_twice_mid_campaign_loses_and_repeats_nothing(tmp_path):
    redis_server = RedisServer(tmp_path / "redis")
    settings = Settings(home=tmp_path / "home", problems_dir=tmp_path / "problems", redis_url=redis_server.url,
                        writers=WRITERS, attempt_wait_s=30)
    names = ["crash_a", "crash_b", "crash_c"]
    db = Database(settings.db_url)
    with db.session() as session:
        ids = [upsert_problem(session, load_problem(write_problem(tmp_path / "problems", n))).id for n in names]
    campaign_id = create_campaign(db, "crash", ids, "cpu", WRITERS, PER_ASSIGNMENT, budgets=Budgets(attempts=BUDGET))

    env = settings_env(settings) | {"PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)])}
    logs = tmp_path / "logs"
    logs.mkdir()
    planner_options = ["-Q", "plan", "--pool", "solo"]
    workers = [Worker("writer", "services.worker.entrypoint", ["-Q", "write", "--pool", "threads", "-c", str(WRITERS)],
                      env, logs),
               Worker("evaluator", "fake_evaluator", ["-Q", "evaluate", "--pool", "threads", "-c", "4"], env, logs)]
    planner = Worker("planner", "services.planner.entrypoint", planner_options, env, logs)
    kills = 0

    def log_tails() -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(logs.glob("*.log")))

    try:
        make_celery(settings).send_task(PLAN_TICK, args=[campaign_id])
        deadline = time.monotonic() + DEADLINE_S
        for kill_after in (4, 11):  # finished assignments before each SIGKILL
            while counts(db, campaign_id).get("DONE", 0) < kill_after:
                assert time.monotonic() < deadline, f"stuck before kill {kills + 1}\n{log_tails()}"
                time.sleep(0.1)
            planner.kill()
            kills += 1
            time.sleep(1.5)  # writers go on and report to a planner that is not there
            planner = Worker(f"planner-{kills}", "services.planner.entrypoint", planner_options, env, logs)
        while campaign_status(db, campaign_id) != "STOPPED":
            assert time.monotonic() < deadline, f"the campaign did not finish: {counts(db, campaign_id)}\n{log_tails()}"
            for worker in [*workers, planner]:
                assert worker.process.poll() is None, f"{worker.name} died\n{log_tails()}"
            time.sleep(0.2)
    finally:
        for worker in [planner, *workers]:
            worker.stop()
        redis_server.stop()

    assert kills == 2
    with db.session() as session:
        rows = session.scalars(select(AssignmentRow).where(AssignmentRow.campaign_id == campaign_id)).all()
        made = dict(session.execute(select(AttemptRow.assignment_id, func.count())
                                    .where(AttemptRow.campaign_id == campaign_id)
                                    .group_by(AttemptRow.assignment_id)).all())
        statuses = set(session.scalars(select(AttemptRow.status).where(AttemptRow.campaign_id == campaign_id)))
        bests = session.scalars(select(CampaignProblemRow.best_attempt_id)
                                .where(CampaignProblemRow.campaign_id == campaign_id)).all()
    assert {r.status for r in rows} == {"DONE"}, log_tails()  # none lost, expired or cancelled
    assert len(rows) == BUDGET // PER_ASSIGNMENT  # none made twice
    assert all(made.get(r.id, 0) == r.budget_attempts == PER_ASSIGNMENT for r in rows), made  # each done once
    assert sum(made.values()) == BUDGET
    assert statuses == {"PASSED"}  # no attempt left in flight
    assert all(bests)  # the best of every problem recorded, lost done messages or not

"""Kill the planner (SIGKILL) twice in the middle of a campaign and start it again, with a real
redis-server, the real planner and writer Celery workers and a fast fake evaluator: every assignment
is done exactly once (its attempts are exactly its budget), none is lost, none is made twice (the
attempts add up to the campaign's budget) and the campaign ends by itself."""

from __future__ import annotations

import os
import time

import pytest
from sqlalchemy import func, select

from clusterkit import HERE, REPO, Worker, campaign_status, counts, log_tails, write_problem
from kernelswarm.launcher import RedisServer, settings_env
from services.planner.campaign import Budgets, create_campaign
from shared.celery_app import PLAN_TICK, make_celery
from shared.db import AssignmentRow, AttemptRow, CampaignProblemRow, Database
from shared.repository import upsert_problem
from shared.schema import load_problem
from shared.settings import Settings

pytestmark = pytest.mark.e2e

BUDGET, PER_ASSIGNMENT, WRITERS = 40, 2, 4
DEADLINE_S = 240


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

    try:
        make_celery(settings).send_task(PLAN_TICK, args=[campaign_id])
        deadline = time.monotonic() + DEADLINE_S
        for kill_after in (4, 11):  # finished assignments before each SIGKILL
            while counts(db, campaign_id).get("DONE", 0) < kill_after:
                assert time.monotonic() < deadline, f"stuck before kill {kills + 1}\n{log_tails(logs)}"
                time.sleep(0.1)
            planner.kill()
            kills += 1
            time.sleep(1.5)  # writers go on and report to a planner that is not there
            planner.restart()
        while campaign_status(db, campaign_id) != "STOPPED":
            assert time.monotonic() < deadline, f"the campaign did not finish: {counts(db, campaign_id)}\n{log_tails(logs)}"
            for worker in [*workers, planner]:
                assert worker.process.poll() is None, f"{worker.name} died\n{log_tails(logs)}"
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
    assert {r.status for r in rows} == {"DONE"}, log_tails(logs)  # none lost, expired or cancelled
    assert len(rows) == BUDGET // PER_ASSIGNMENT  # none made twice
    assert all(made.get(r.id, 0) == r.budget_attempts == PER_ASSIGNMENT for r in rows), made  # each done once
    assert sum(made.values()) == BUDGET
    assert statuses == {"PASSED"}  # no attempt left in flight
    assert all(bests)  # the best of every problem recorded, lost done messages or not

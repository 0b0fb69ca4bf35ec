"""Faults injected into a running campaign, on the real cluster (redis-server, the planner, the
writers and the real CPU evaluator with its sandboxed children): each Celery service killed with
SIGKILL mid-work and started again, and Redis killed and started empty. A service that exits by
itself meanwhile is started again, as `restart: unless-stopped` in docker-compose.yml and
`kernelswarm up` do (the writer's Celery process can crash in kombu when Redis goes away under an
acknowledgement). The campaign must end by itself with every attempt evaluated exactly once (one verdict, one trace per workload), none lost
(no attempt left without a verdict or given up), its budget spent exactly, and no process of a
killed evaluator left running."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from sqlalchemy import func, select

from clusterkit import REPO, Worker, campaign_status, counts, log_tails, write_problem
from kernelswarm.launcher import RedisServer, settings_env
from services.planner.campaign import Budgets, create_campaign
from shared.celery_app import PLAN_TICK, make_celery
from shared.db import AssignmentRow, AttemptRow, Database, TraceRow
from shared.repository import upsert_problem
from shared.schema import load_problem
from shared.process import children_of, running
from shared.settings import Settings

pytestmark = pytest.mark.e2e

BUDGET, PER_ASSIGNMENT, WRITERS = 14, 2, 2
DEADLINE_S = 420
# About a second per attempt (5 calls), so that the evaluator is reliably caught in the middle of one.
SLOW_SEED = "import time\n\ndef run(x, y):\n    time.sleep(0.2)\n    y.copy_(x * 2)\n"


def attempts_by_status(db: Database, campaign_id: int) -> dict[str, int]:
    with db.session() as session:
        return dict(session.execute(select(AttemptRow.status, func.count()).where(AttemptRow.campaign_id == campaign_id)
                                    .group_by(AttemptRow.status)).all())


def finished(db: Database, campaign_id: int) -> int:
    return sum(n for status, n in attempts_by_status(db, campaign_id).items() if status not in ("PENDING", "RUNNING"))


def descendants(pid: int) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        kids = children_of(frontier.pop())
        found += kids
        frontier += kids
    return found


def test_the_swarm_survives_its_services_and_its_broker_dying_mid_campaign(tmp_path):
    redis_server = RedisServer(tmp_path / "redis")
    settings = Settings(home=tmp_path / "home", problems_dir=tmp_path / "problems", redis_url=redis_server.url,
                        writers=WRITERS, attempt_wait_s=120, lease_s=3, sweep_every_s=1, correctness_rounds=1,
                        timing_sets=1, warmup_runs=1, timing_runs=3, timing_budget_s=0.05, attempt_timeout_s=30)
    db = Database(settings.db_url)
    with db.session() as session:
        ids = [upsert_problem(session, load_problem(write_problem(tmp_path / "problems", name, SLOW_SEED))).id
               for name in ("fault_a", "fault_b")]
    campaign_id = create_campaign(db, "faults", ids, "cpu", WRITERS, PER_ASSIGNMENT, budgets=Budgets(attempts=BUDGET))
    env = settings_env(settings) | {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    logs = tmp_path / "logs"
    logs.mkdir()
    services = {
        "planner": Worker("planner", "services.planner.entrypoint", ["-Q", "plan", "--pool", "solo"], env, logs),
        "writer": Worker("writer", "services.worker.entrypoint",
                         ["-Q", "write", "--pool", "threads", "-c", str(WRITERS)], env, logs),
        "evaluator": Worker("evaluator", "services.evaluator.entrypoint", ["-Q", "evaluate", "--pool", "solo"],
                            env, logs),
    }
    deadline = time.monotonic() + DEADLINE_S
    injected: list[str] = []
    supervised: list[str] = []  # services that exited by themselves, started again as compose would

    def wait_for(what: str, condition: Callable[[], bool], killed: str | None = None) -> None:
        while not condition():
            assert time.monotonic() < deadline, (f"waited in vain for {what} after {injected}: "
                                                 f"{attempts_by_status(db, campaign_id)}\n{log_tails(logs)}")
            for name, worker in services.items():
                if name != killed and worker.process.poll() is not None:
                    # docker-compose.yml (`restart: unless-stopped`) and `kernelswarm up` restart a
                    # service that exits: Celery's worker can crash when its broker vanishes.
                    supervised.append(f"{name} (exit {worker.process.returncode}, after {injected[-1:]})")
                    assert len(supervised) <= 4, f"services keep exiting: {supervised}\n{log_tails(logs)}"
                    worker.restart()
            time.sleep(0.1)

    def any_running(table) -> bool:
        with db.session() as session:
            return session.scalar(select(func.count()).select_from(table).where(
                table.campaign_id == campaign_id, table.status == "RUNNING")) > 0

    try:
        make_celery(settings).send_task(PLAN_TICK, args=[campaign_id])

        # 1. The evaluator, in the middle of an attempt: its children must go with it.
        wait_for("an attempt being evaluated", lambda: finished(db, campaign_id) >= 2 and any_running(AttemptRow))
        evaluator = services["evaluator"]
        orphans = descendants(evaluator.process.pid)
        assert orphans, "the evaluator had no children to leave behind"
        evaluator.kill()
        injected.append("evaluator SIGKILL")
        wait_for("the killed evaluator's children to exit", lambda: not [p for p in orphans if running(p)],
                 killed="evaluator")
        evaluator.restart()

        # 2. A writer holding an assignment.
        done = finished(db, campaign_id)
        wait_for("a writer at work", lambda: finished(db, campaign_id) >= done + 2 and any_running(AssignmentRow))
        services["writer"].restart()
        injected.append("writer SIGKILL")

        # 3. Redis, with everything queued in it.
        done = finished(db, campaign_id)
        wait_for("more verdicts", lambda: finished(db, campaign_id) >= done + 2)
        redis_server.restart()
        injected.append("redis restart")
        wait_for("the planner to notice the new Redis",  # its sweep sends what the old one lost
                 lambda: "the broker restarted" in (logs / "planner.log").read_text(errors="replace"))

        # 4. The planner.
        done = finished(db, campaign_id)
        wait_for("verdicts after the broker came back", lambda: finished(db, campaign_id) >= done + 2)
        services["planner"].restart()
        injected.append("planner SIGKILL")

        wait_for("the campaign to end by itself", lambda: campaign_status(db, campaign_id) == "STOPPED")
    finally:
        for worker in services.values():
            worker.stop()
        redis_server.stop()

    with db.session() as session:
        attempts = session.scalars(select(AttemptRow).where(AttemptRow.campaign_id == campaign_id)).all()
        traces = dict(session.execute(select(TraceRow.attempt_id, func.count()).group_by(TraceRow.attempt_id)).all())
    report = (f"{[(a.status, a.tries, a.message) for a in attempts]}\n{counts(db, campaign_id)}\n"
              f"restarted by the supervisor: {supervised}\n{log_tails(logs)}")
    print(f"faults injected: {injected}; services restarted as a supervisor would: {supervised or 'none'}")
    assert injected == ["evaluator SIGKILL", "writer SIGKILL", "redis restart", "planner SIGKILL"]
    assert len(attempts) == BUDGET, report  # the budget spent exactly: none made twice, none missing
    assert {a.status for a in attempts} == {"PASSED"}, report  # none lost, none given up
    assert all(traces.get(a.id) == a.workloads_total == 1 for a in attempts), report  # each counted once
    assert any(a.tries == 2 for a in attempts), report  # the attempt the evaluator died in was run again
    assert "was running when evaluator evaluator@test stopped: sent again" in (logs / "evaluator.log").read_text()
    assert "the broker restarted" in (logs / "planner.log").read_text()  # and what it lost was sent again

"""Issue 40, rows H2, H3, M1 and item 4: faults are not verdicts and never lose work, an attempt
that kills its evaluator twice is quarantined, no process that keeps dying stops `kernelswarm up`,
and /status shows PIDs and host paths to a logged-in user only. Each attack has an honest control
through the same stage beside it, so that a stage that simply breaks passes neither."""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery

from kernelswarm.launcher import MAX_RESTARTS, Services
from services.evaluator import record, tasks
from services.planner.sweep import sweep
from services.planner.tick import PlannerConfig
from shared.celery_app import EVALUATE
from shared.db import AttemptRow, utcnow
from shared.runtime import Runtime
from shared.settings import Settings
from tests.attacks.faultskit import (PROBLEMS, Evaluations, FailingCommits, new_attempt, row, run_dying_evaluator,
                                     run_limited_evaluator, traces, writes_a_verdict)

TOKEN = secrets.token_urlsafe(32)


@pytest.fixture
def runtime(tmp_path: Path):
    runtime = Runtime(Settings(home=tmp_path, problems_dir=PROBLEMS))
    yield runtime
    runtime.db.dispose()


@pytest.fixture
def evaluations(monkeypatch) -> Evaluations:
    stand_in = Evaluations()
    monkeypatch.setattr(record, "evaluate", stand_in)
    monkeypatch.setattr(record, "spares_for", lambda *args: None)
    monkeypatch.setattr(record, "WRITE_BACKOFF_S", 0.01, raising=False)
    return stand_in


def evaluate_task(runtime: Runtime):
    """The `evaluate` Celery task as the evaluator registers it, run eagerly (its retries too)."""
    app = Celery(f"faults-attack-{uuid.uuid4().hex}")  # an app of its own: the task's name registered once
    app.conf.task_always_eager = True
    tasks.register(app, runtime)
    return app.tasks[EVALUATE]


# H2: a file size limit of the evaluator's machine is the evaluator's fault, not the candidate's.

def test_h2_a_machine_file_size_limit_is_an_evaluator_fault_not_a_runtime_error(tmp_path):
    line = run_limited_evaluator(tmp_path, limit=1 << 20, size=2 << 20)  # the machine: 1 MiB; promised: 64 GiB
    assert line.startswith("FAULT PENDING "), line  # retried later or elsewhere, the attempt given back
    assert "File too large is its fault" in line


def test_h2_control_the_same_solution_passes_on_a_machine_without_the_limit(tmp_path):
    assert run_limited_evaluator(tmp_path, limit=0, size=2 << 20).startswith("VERDICT PASSED"), tmp_path


def test_h2_control_a_candidate_past_its_own_promised_bound_is_still_its_own_fault(tmp_path):
    # promised 512 KiB, the machine allows 1 MiB: a 2 MiB file is the candidate's own doing
    line = run_limited_evaluator(tmp_path, limit=1 << 20, size=2 << 20, promise=512 << 10)
    assert line.startswith("VERDICT RUNTIME_ERROR") and "File too large" in line, line


# H3: a failed DB write never loses work.

def test_h3_a_failed_verdict_commit_is_written_again_and_the_attempt_ends_exactly_once(runtime, evaluations):
    attempt_id = new_attempt(runtime)
    with FailingCommits(1, writes_a_verdict) as failing:
        evaluate_task(runtime).apply(args=(attempt_id,), throw=False)
    attempt = row(runtime, attempt_id)
    assert failing.failed == 1
    assert (attempt.status, traces(runtime, attempt_id), evaluations.calls) == ("PASSED", 1, 1)


def test_h3_a_db_that_fails_at_the_claim_is_retried_not_dropped(runtime, evaluations):
    attempt_id = new_attempt(runtime)
    with FailingCommits(2) as failing:  # the claim, then giving it back: both refused
        evaluate_task(runtime).apply(args=(attempt_id,), throw=False)
    attempt = row(runtime, attempt_id)
    assert failing.failed == 2
    assert (attempt.status, traces(runtime, attempt_id), evaluations.calls) == ("PASSED", 1, 1)


def test_h3_control_without_a_fault_the_task_evaluates_once(runtime, evaluations):
    attempt_id = new_attempt(runtime)
    evaluate_task(runtime).apply(args=(attempt_id,), throw=False)
    assert (row(runtime, attempt_id).status, traces(runtime, attempt_id), evaluations.calls) == ("PASSED", 1, 1)


def _set(runtime: Runtime, attempt_id: str, **values) -> None:
    with runtime.db.session() as session:
        attempt = session.get(AttemptRow, attempt_id)
        for name, value in values.items():
            setattr(attempt, name, value)


def test_h3_the_sweep_sends_again_within_minutes_what_was_lost_in_flight_and_leaves_live_work(runtime):
    now = utcnow()
    ago = lambda minutes: now - timedelta(minutes=minutes)  # noqa: E731
    stalled, live, lost, fresh = (new_attempt(runtime) for _ in range(4))
    _set(runtime, stalled, status="RUNNING", evaluator="evaluator@gone", created_at=ago(15), started_at=ago(10),
         seen_at=ago(4))  # its evaluator stopped beating 4 min ago (it died; its task failed)
    _set(runtime, live, status="RUNNING", evaluator="evaluator@busy", created_at=ago(15), started_at=ago(10),
         seen_at=now - timedelta(seconds=10))  # a long evaluation that still beats
    _set(runtime, lost, created_at=ago(6))  # PENDING for 6 min: its message dropped with a failed task
    _set(runtime, fresh, created_at=ago(1))  # PENDING for a minute: waiting in the queue
    sent: list[tuple[str, str]] = []

    sweep(runtime.db, lambda ids: None, lambda c: None, PlannerConfig(), now=now,
          send_evaluate=lambda *a: sent.append(a))

    assert sorted(sent) == sorted([(stalled, "cpu"), (lost, "cpu")])
    assert (row(runtime, stalled).status, row(runtime, stalled).evaluator) == ("PENDING", None)
    assert (row(runtime, live).status, row(runtime, live).evaluator) == ("RUNNING", "evaluator@busy")
    sent.clear()
    sweep(runtime.db, lambda ids: None, lambda c: None, PlannerConfig(), now=now + timedelta(seconds=15),
          send_evaluate=lambda *a: sent.append(a))
    assert sent == []  # once a period, not at every sweep


def test_h3_control_an_evaluation_that_runs_long_keeps_its_attempt_by_its_heartbeat(runtime, evaluations,
                                                                                   monkeypatch):
    monkeypatch.setattr(record, "HEARTBEAT_S", 0.05, raising=False)
    attempt_id = new_attempt(runtime)
    evaluations.release.clear()
    running = threading.Thread(target=record.evaluate_attempt, args=(runtime, attempt_id, "cpu", "evaluator@a", 600.0))
    running.start()
    try:
        assert evaluations.started.wait(60)
        time.sleep(2.5)  # longer than the sweep's limit below: only the heartbeat keeps the attempt
        sent: list[tuple[str, str]] = []
        sweep(runtime.db, lambda ids: None, lambda c: None, PlannerConfig(stalled_after_s=2.0), now=utcnow(),
              send_evaluate=lambda *a: sent.append(a))
        assert sent == [] and row(runtime, attempt_id).evaluator == "evaluator@a"
    finally:
        evaluations.release.set()
        running.join()
    assert (row(runtime, attempt_id).status, evaluations.calls, traces(runtime, attempt_id)) == ("PASSED", 1, 1)


# M1: an attempt that kills its evaluator twice is quarantined, whichever evaluator takes it.

def test_m1_an_attempt_that_kills_its_evaluator_twice_is_quarantined(runtime, tmp_path, evaluations):
    attempt_id = new_attempt(runtime)
    fast = PlannerConfig(stalled_after_s=0.0)  # the sweep of minutes later, without the wait
    for name in ("evaluator@a", "evaluator@b"):  # each dies under it and is not seen again
        done = run_dying_evaluator(tmp_path, attempt_id, name)
        assert done.returncode == -9 and "RETURNED" not in done.stdout, done.stderr[-2000:]
        sent: list[tuple[str, str]] = []
        sweep(runtime.db, lambda ids: None, lambda c: None, fast, now=utcnow() + timedelta(seconds=1),
              send_evaluate=lambda *a: sent.append(a))
        assert sent == [(attempt_id, "cpu")]

    assert record.evaluate_attempt(runtime, attempt_id, "cpu", "evaluator@c", 600.0) == "RUNTIME_ERROR"
    attempt = row(runtime, attempt_id)
    assert attempt.message.startswith("quarantined: its evaluator died 2 times") and evaluations.calls == 0


def test_m1_control_an_honest_attempt_on_the_same_evaluator_is_evaluated(runtime, evaluations):
    attempt_id = new_attempt(runtime)
    assert record.evaluate_attempt(runtime, attempt_id, "cpu", "evaluator@c", 600.0) == "PASSED"
    assert (row(runtime, attempt_id).message, evaluations.calls) == (None, 1)


# M1: a service that keeps dying never stops `kernelswarm up`'s supervisor, nor the other services.

@dataclass
class DyingEvaluator(Services):
    """`up`'s services as tiny programs: the evaluator exits at once, every time; the others wait."""

    backoff_s: float = 0.0

    def _start(self, name: str) -> None:
        code = "import sys; sys.exit(137)" if name == "evaluator" else "import time; time.sleep(120)"
        self.processes[name] = subprocess.Popen([sys.executable, "-c", code])


def test_m1_a_service_that_keeps_dying_is_restarted_and_the_others_keep_running(tmp_path, monkeypatch):
    monkeypatch.setattr("kernelswarm.launcher.RESTART_BACKOFF_MAX_S", 0.0)  # the crash loop's backoff, without the wait
    services = DyingEvaluator(Settings(home=tmp_path), tmp_path / "logs")
    try:
        services.start()
        others = {name: services.processes[name] for name in ("planner", "worker")}
        exits = []
        deadline = time.monotonic() + 60
        while len(exits) < MAX_RESTARTS + 3 and time.monotonic() < deadline:
            exits += services.supervise()
            time.sleep(0.02)
        assert len(exits) == MAX_RESTARTS + 3 and all(e.name == "evaluator" for e in exits)
        assert all(e.restart_in_s is not None for e in exits)  # never given up
        assert exits[-1].crash_loop and "it keeps exiting" in exits[-1].describe()
        assert all(services.processes[name] is p and p.poll() is None for name, p in others.items())
        [state] = [s for s in services.states() if s.name == "evaluator"]
        assert state.crash_loop and state.restarts >= MAX_RESTARTS + 2
    finally:
        services.stop(wait_s=2)


def test_m1_control_a_service_that_exits_once_is_restarted_without_a_crash_loop(tmp_path):
    services = DyingEvaluator(Settings(home=tmp_path), tmp_path / "logs")
    try:
        services.start()
        deadline = time.monotonic() + 30
        exits = []
        while not exits and time.monotonic() < deadline:
            exits = services.supervise()
            time.sleep(0.02)
        [exit_] = exits
        assert (exit_.name, exit_.restart, exit_.restart_in_s) == ("evaluator", 1, 0.0)
        assert "starting it again now, restart 1 of 5" in exit_.describe()
    finally:
        services.stop(wait_s=2)


# Item 4: PIDs and host paths to a logged-in user only.

@pytest.fixture
def status_client(tmp_path):
    from services.web import backends, create_app, status
    from services.web.status_data import SupervisedProcess
    from shared.db import Database
    from shared.store import LocalStore

    db = Database(f"sqlite:///{tmp_path}/web.db")
    app = create_app(Settings(home=tmp_path, submit_token=TOKEN), db, LocalStore(tmp_path / "store"))
    app.config["TESTING"] = True
    status.show_processes(app, lambda: [
        SupervisedProcess(name="evaluator", pid=48151, restarts=2, last_exit="was killed by SIGKILL")])
    yield app.test_client()
    app.extensions[backends.EXTENSION].close()
    db.dispose()


def _log_in(client) -> None:
    page = client.get("/login").get_data(as_text=True)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    assert client.post("/login", data={"csrf_token": csrf, "token": TOKEN}).status_code == 302


def test_item4_status_hides_pids_from_a_visitor_who_is_not_logged_in(status_client):
    body = status_client.get("/api/status").get_json()
    assert [p["pid"] for p in body["processes"]] == [None] and body["details_hidden"] is True
    assert "48151" not in status_client.get("/status").get_data(as_text=True)
    assert "48151" not in status_client.get("/api/status").get_data(as_text=True)


def test_item4_control_a_logged_in_user_sees_the_pids(status_client):
    _log_in(status_client)
    body = status_client.get("/api/status").get_json()
    assert [p["pid"] for p in body["processes"]] == [48151] and not body.get("details_hidden")
    assert "48151" in status_client.get("/status").get_data(as_text=True)
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    status_client.post("/logout", data={"csrf_token": re.search(
        r'name="csrf_token" value="([^"]+)"', status_client.get("/status").get_data(as_text=True)).group(1)})
    assert status_client.get("/api/status", headers=bearer).get_json()["processes"][0]["pid"] == 48151


def test_item4_host_paths_in_evaluator_faults_are_hidden_without_login():
    from services.web.status_data import hide_paths

    said = "saving input set 0 failed: [Errno 28] No space left on device: '/root/.kernelswarm/scratch/k1/x.bin'"
    assert hide_paths(said) == "saving input set 0 failed: [Errno 28] No space left on device: '<path>'"
    assert hide_paths("Redis unreachable: Error 111 connecting to 127.0.0.1:6379") == \
        "Redis unreachable: Error 111 connecting to 127.0.0.1:6379"  # no path in it: unchanged

"""`kernelswarm up` supervises every process it starts, Redis included: one that exits is reaped,
named on the console and started again (Redis on the same port) after a backoff, as compose's
`restart: unless-stopped` does; one that keeps exiting is in a crash loop, said so and restarted with
backoff, and never stops `up` or the other processes (issue 40, M1)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from rich.console import Console

from kernelswarm import up
from kernelswarm.cli import main
from kernelswarm.launcher import MAX_RESTARTS, REDIS, RESTART_BACKOFF_MAX_S, Exit, RedisServer, Services
from shared.db import CampaignRow, Database
from shared.settings import Settings
from tests.cli.upsetup import prepare_up

EXITING = "import sys; sys.exit(3)"
WAITING = "import time; time.sleep(60)"


@dataclass
class QuickServices(Services):
    """Services whose workers are tiny Python programs: `exits` ones end at once, others wait."""

    backoff_s: float = 0.0
    exits: frozenset[str] = frozenset()

    def _start(self, name: str) -> None:
        if name == REDIS:
            super()._start(name)
            return
        code = EXITING if name in self.exits else WAITING
        self.processes[name] = subprocess.Popen([sys.executable, "-c", code])


def wait_for_exits(services: Services, timeout_s: float = 10.0) -> list[Exit]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        exits = services.supervise()
        if exits:
            return exits
        time.sleep(0.02)
    raise AssertionError(f"no process exited within {timeout_s} s")


def proc_state(pid: int) -> str | None:
    """The state letter in /proc/PID/stat (Z for a zombie), None once no such process exists."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def wait_for_zombie(pid: int, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while proc_state(pid) != "Z":
        assert time.monotonic() < deadline, f"process {pid} did not die"
        time.sleep(0.01)


def reaped(pid: int) -> bool:
    """True once `pid` is no child of ours, dead or alive (no zombie left behind)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return proc_state(pid) != "Z"
    return False


@pytest.fixture
def db(tmp_path):
    database = Database(f"sqlite:///{tmp_path}/up.db")
    yield database
    database.dispose()


@pytest.mark.database_agnostic("up's queries, run on PostgreSQL by tests/cli/test_up_campaign.py and "
                               "tests/cli/test_up_drain.py")
def test_redis_killed_outright_is_reaped_named_and_started_again_on_its_port(tmp_path, db):
    server = RedisServer(tmp_path / "redis")
    services = QuickServices(Settings(home=tmp_path), tmp_path / "logs", redis=server)
    out = io.StringIO()
    try:
        services.start()
        killed = server.process.pid
        os.kill(killed, signal.SIGKILL)
        wait_for_zombie(killed)  # dead, and nobody reaped it yet

        with db.session() as session:
            session.add(CampaignRow(id=1, name="watched"))
        up._watch(db, 1, services, 1.0, {"signal": False}, Console(file=out, width=200))

        assert server.process.pid != killed and server.process.poll() is None
        assert reaped(killed)
        client = redis.Redis.from_url(server.url)  # the same URL: clients reconnect
        assert client.ping()
        client.close()
        assert f"redis (pid {killed}) was killed by SIGKILL; starting it again now, restart 1 of 5" in out.getvalue()
        [state] = [s for s in services.states() if s.name == REDIS]
        assert (state.pid, state.restarts, state.last_exit) == (server.process.pid, 1, "was killed by SIGKILL")
    finally:
        services.stop()
        server.stop()


def test_restarts_back_off_and_a_crash_loop_is_restarted_at_the_longest_backoff(tmp_path):
    services = QuickServices(Settings(home=tmp_path), tmp_path / "logs", backoff_s=0.2, exits=frozenset({"worker"}))
    try:
        services.start()
        first = services.processes["worker"]
        [exit_] = wait_for_exits(services)
        assert (exit_.name, exit_.returncode, exit_.restart_in_s, exit_.restart) == ("worker", 3, 0.0, 1)
        assert services.processes["worker"] is not first and reaped(first.pid)  # restarted in the same pass

        [exit_] = wait_for_exits(services)
        assert (exit_.restart_in_s, exit_.restart) == (0.2, 2)  # then 0.4, 0.8 s, ...
        waiting = services.processes["worker"]
        assert services.supervise() == [] and services.processes["worker"] is waiting  # not yet
        time.sleep(0.25)
        assert services.supervise() == [] and services.processes["worker"] is not waiting

        for restart in range(3, MAX_RESTARTS + 1):
            assert wait_for_exits(services)[0].restart == restart  # started again by a later pass
        [looping] = wait_for_exits(services)
        assert looping.crash_loop and looping.restart_in_s == RESTART_BACKOFF_MAX_S
        assert "it keeps exiting (6 restarts within 10 min)" in looping.describe()
        assert services.supervise() == []  # said once, then waits for its backoff
        assert services.processes["planner"].poll() is None and services.restart_counts.get("planner") is None
        assert services.restart_counts["worker"] == MAX_RESTARTS
        [state] = [s for s in services.states() if s.name == "worker"]
        assert state.crash_loop and state.pid is None  # waiting to be started again
    finally:
        services.stop()


@dataclass
class CrashingServices(Services):
    """`up`'s services with one worker that exits at once, every time."""

    backoff_s: float = 0.01

    def _commands(self) -> dict[str, list[str]]:
        return {"worker": []}

    def _start(self, name: str) -> None:
        if name == REDIS:
            super()._start(name)
            return
        self.processes[name] = subprocess.Popen([sys.executable, "-c", EXITING])


@pytest.mark.database_agnostic("up's queries, run on PostgreSQL by tests/cli/test_up_campaign.py and "
                               "tests/cli/test_up_drain.py")
def test_up_keeps_going_when_a_process_keeps_exiting(tmp_path, monkeypatch, capsys):
    prepare_up(tmp_path, monkeypatch, CrashingServices)
    monkeypatch.setenv("COLUMNS", "400")  # one console line per message
    assert main(["up", "--duration", "9"]) == 0  # ran its whole duration (a restart a second: 0.5 s a pass)

    stderr = capsys.readouterr().err
    assert "worker (pid" in stderr and "exited with code 3; starting it again now, restart 1 of 5" in stderr
    assert "exited with code 3; starting it again in 0.01 s, restart 2 of 5" in stderr  # then 0.02 s, ...
    assert "exited with code 3; it keeps exiting (6 restarts within 10 min): starting it again in 60 s" in stderr
    assert "not starting it again" not in stderr


def test_redis_is_out_of_the_terminals_reach(tmp_path):
    """A terminal's Ctrl-C goes to its foreground process group. Redis runs in a session of its own
    (as the services do, `Services._start`), so the Ctrl-C reaches `up` alone, which pauses the
    campaign, lets the attempts in flight finish and stops Redis last; a Redis killed by the Ctrl-C
    first left every worker without its broker while `up` drained."""
    server = RedisServer(tmp_path / "redis")
    try:
        assert os.getpgid(server.process.pid) != os.getpgid(0)
        assert os.getsid(server.process.pid) == server.process.pid
    finally:
        server.stop()

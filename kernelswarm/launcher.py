"""`kernelswarm up`: Redis (unless one is given), planner, writers, evaluator and web on one machine."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis
from rich.console import Console

from shared.celery_app import evaluate_queue
from shared.errors import UserError
from shared.process import die_with_parent
from shared.settings import PREFIX, Settings

GRACE_S = 30.0
MAX_RESTARTS = 5  # a service that exits this often within RESTART_WINDOW_S is left dead (and `up` stops)
RESTART_WINDOW_S = 600.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class RedisServer:
    """A private redis-server on a free loopback port, gone when stopped."""

    def __init__(self, workdir: Path) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise UserError("redis-server not found: install it (`apt-get install redis-server`, "
                            "or run `make run`) or set KERNELSWARM_REDIS_URL")
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._start()

    def _start(self) -> None:
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent())
        self._wait()

    def restart(self) -> None:
        """Killed outright and started again on the same port: a new instance, every queue empty
        (what the swarm must survive)."""
        self.process.kill()
        self.process.wait()
        self._start()

    def _wait(self, timeout_s: float = 10.0) -> None:
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise UserError(f"redis-server exited with code {self.process.returncode}")
            try:
                client.ping()
                client.close()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        self.stop()
        raise UserError(f"redis-server did not answer on port {self.port} within {timeout_s:.0f} s")

    def stop(self) -> None:
        stop_process(self.process, 5)


def stop_process(process: subprocess.Popen, timeout_s: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout_s`; reaped either way."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that makes a child process build the same Settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(PREFIX)}
    for name, value in settings.model_dump(exclude_defaults=True).items():
        env[PREFIX + name.upper()] = str(value.resolve() if isinstance(value, Path) else value)
    env[PREFIX + "HOME"] = str(settings.home.resolve())
    env[PREFIX + "PROBLEMS_DIR"] = str(settings.problems_dir.resolve())
    return env


@dataclass
class Services:
    """The Celery workers of one local swarm, each a process with its own log file."""

    settings: Settings
    log_dir: Path
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    dead_unexpectedly: list[str] = field(default_factory=list)

    restarts: dict[str, list[float]] = field(default_factory=dict)  # name -> monotonic times of restarts

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for name in self._commands():
            self._start(name)

    def _commands(self) -> dict[str, list[str]]:
        writers = str(max(1, self.settings.writers))
        return {
            "planner": ["services.planner.entrypoint", "-Q", "plan", "--pool", "solo"],
            "worker": ["services.worker.entrypoint", "-Q", "write", "--pool", "threads", "-c", writers],
            "evaluator": ["services.evaluator.entrypoint", "-Q", evaluate_queue(self.settings.device), "--pool", "solo"],
        }

    def _start(self, name: str) -> None:
        module, *options = self._commands()[name]
        with open(self.log_dir / f"{name}.log", "ab") as log:
            self.processes[name] = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", module, "worker", "-n", f"{name}@%h", "--without-gossip",
                 "--without-mingle", "-l", self.settings.log_level, *options],
                env=settings_env(self.settings), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=die_with_parent())  # a launcher killed outright takes them along

    def dead(self) -> list[str]:
        return [name for name, p in self.processes.items() if p.poll() is not None]

    def restart_dead(self) -> tuple[list[str], list[str]]:
        """As compose's `restart: unless-stopped`: start again each service that exited, unless it
        already did so `MAX_RESTARTS` times within `RESTART_WINDOW_S` (a crash loop). Returns
        (restarted, given up)."""
        restarted, given_up = [], []
        now = time.monotonic()
        for name in self.dead():
            recent = [t for t in self.restarts.get(name, []) if now - t < RESTART_WINDOW_S]
            if len(recent) >= MAX_RESTARTS:
                given_up.append(name)
                continue
            self.restarts[name] = [*recent, now]
            self._start(name)
            restarted.append(name)
        return restarted, given_up

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + 15
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class WebServer:
    """The Flask app served by werkzeug in a thread of the launcher (no versions in its `Server` header)."""

    def __init__(self, settings: Settings, port: int) -> None:
        from services.web import create_app
        from services.web.serving import make_server

        self.server = make_server("127.0.0.1", port, create_app(settings))
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=5)


def console() -> Console:
    return Console(stderr=True)

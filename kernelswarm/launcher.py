"""`kernelswarm up`: Redis (unless one is given), planner, writers, evaluator and web on one machine."""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import redis
from rich.console import Console

from shared.celery_app import evaluate_queue
from shared.errors import UserError
from shared.home import private_folder
from shared.process import die_with_parent
from shared.settings import PREFIX, Settings

if TYPE_CHECKING:
    from services.web.status_data import SupervisedProcess

GRACE_S = 30.0
STOP_WAIT_S = 15.0  # for the workers' warm shutdown, SIGTERM to SIGKILL
CUT_OFF_WAIT_S = 3.0  # the same, once the attempts in flight have had their GRACE_S: for the idle ones
MAX_RESTARTS = 5  # a process that exits more often within RESTART_WINDOW_S is in a crash loop: still restarted
RESTART_WINDOW_S = 600.0
RESTART_BACKOFF_S = 1.0  # the wait before each restart within the window: 0, 1, 2, 4, 8 s, ... up to the max
RESTART_BACKOFF_MAX_S = 60.0
REDIS = "redis"  # the supervised name of the private redis-server
WEB_LOGGER = "werkzeug"  # werkzeug's server logs each request there at INFO, and its own errors


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
    """A private redis-server on a free loopback port, gone when stopped. Its output goes to
    `redis.log` in its folder. It asks for a random password (`requirepass`, in `redis.conf` in its
    folder, 0600, so that it is not on the command line `ps` shows), which `url` carries."""

    def __init__(self, workdir: Path) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise UserError("redis-server not found: install it (`apt-get install redis-server`, "
                            "or run `make run`) or set KERNELSWARM_REDIS_URL")
        self.workdir = private_folder(workdir)  # and the home above it, when `up` makes it (shared/home.py)
        self.log_path = workdir / "redis.log"
        self.port = free_port()
        password = secrets.token_hex(32)
        self.config = write_private(workdir / "redis.conf", f"requirepass {password}\n")
        self.url = f"redis://:{password}@127.0.0.1:{self.port}/0"
        self._start()

    def _spawn(self) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [self.binary, str(self.config), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(self.workdir)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,  # a terminal's Ctrl-C reaches `up` alone, which stops Redis last
                preexec_fn=die_with_parent())

    def _start(self) -> None:
        self._spawn()
        problem = self.wait_ready()
        if problem is not None:
            self.stop()
            raise UserError(problem)

    def restart(self) -> None:
        """Killed outright and started again on the same port: a new instance, every queue empty
        (what the swarm must survive)."""
        self.process.kill()
        self.process.wait()
        self._start()

    def start_again(self) -> None:
        """After it exited: started on the same port (clients reconnect to the same URL), waited
        for but never raising; one that exits again is seen by its supervisor as another exit."""
        self._spawn()
        self.wait_ready()

    def wait_ready(self, timeout_s: float = 10.0) -> str | None:
        """None once it answers a ping; otherwise why it does not."""
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    return f"redis-server {describe_exit(self.process.returncode)} (see {self.log_path})"
                try:
                    client.ping()
                    return None
                except redis.ConnectionError:
                    time.sleep(0.05)
        finally:
            client.close()
        return f"redis-server did not answer on port {self.port} within {timeout_s:.0f} s"

    def stop(self) -> None:
        stop_process(self.process, 5)


def describe_exit(returncode: int) -> str:
    """`exited with code 3`, or `was killed by SIGKILL` (Popen's negative return code)."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        return f"was killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"was killed by signal {-returncode}"


def write_private(path: Path, text: str) -> Path:
    """`text` in `path`, readable by its owner alone (0600 from its creation on)."""
    path.unlink(missing_ok=True)
    with os.fdopen(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600), "w") as file:
        file.write(text)
    return path


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


@dataclass(frozen=True)
class Exit:
    """A supervised process that ended and was reaped: started again after `restart_in_s` (the
    `restart`-th time within RESTART_WINDOW_S). Never given up: one process that keeps dying (an
    evaluator killed by what it runs, an out-of-memory kill) must not stop the swarm; past
    MAX_RESTARTS it is in a crash loop, said so, and restarted at the longest backoff."""

    name: str
    pid: int
    returncode: int
    restart_in_s: float
    restart: int

    @property
    def crash_loop(self) -> bool:
        return self.restart > MAX_RESTARTS

    def describe(self) -> str:
        what = f"{self.name} (pid {self.pid}) {describe_exit(self.returncode)}"
        when = "now" if self.restart_in_s == 0 else f"in {self.restart_in_s:g} s"
        window = f"{RESTART_WINDOW_S / 60:.0f} min"
        if self.crash_loop:
            return (f"{what}; it keeps exiting ({self.restart} restarts within {window}): starting it again {when}, "
                    "backing off; the other processes keep running")
        return f"{what}; starting it again {when}, restart {self.restart} of {MAX_RESTARTS} within {window}"


@dataclass
class Services:
    """The processes of one local swarm, supervised: the Celery workers, each with its own log file,
    and the private redis-server when `redis` is given. As compose's `restart: unless-stopped`, a
    process that exits is reaped and started again (Redis on the same port), after a backoff that
    doubles from `backoff_s` up to RESTART_BACKOFF_MAX_S; one that exits after `MAX_RESTARTS` restarts
    within `RESTART_WINDOW_S` is in a crash loop (said on the console and /status), restarted at the
    longest backoff, never given up: the others keep running."""

    settings: Settings
    log_dir: Path
    redis: RedisServer | None = None
    backoff_s: float = RESTART_BACKOFF_S
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    restarts: dict[str, list[float]] = field(default_factory=dict)  # name -> monotonic times of recent restarts
    restart_counts: dict[str, int] = field(default_factory=dict)  # name -> restarts since start
    last_exits: dict[str, str] = field(default_factory=dict)  # name -> how it last ended
    due: dict[str, float] = field(default_factory=dict)  # name -> monotonic time its restart is due
    crash_loops: set[str] = field(default_factory=set)  # names restarted more than MAX_RESTARTS within the window
    lock: threading.Lock = field(default_factory=threading.Lock)  # for `states`, read by the web's thread

    def start(self) -> None:
        private_folder(self.log_dir)
        if self.redis is not None:
            self.processes[REDIS] = self.redis.process
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
        if name == REDIS:
            self.redis.start_again()
            self.processes[name] = self.redis.process
            return
        module, *options = self._commands()[name]
        with open(self.log_dir / f"{name}.log", "ab") as log:
            self.processes[name] = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", module, "worker", "-n", f"{name}@%h", "--without-gossip",
                 "--without-mingle", "-l", self.settings.log_level, *options],
                env=settings_env(self.settings), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=die_with_parent())  # a launcher killed outright takes them along

    def log_of(self, name: str) -> Path:
        return self.redis.log_path if name == REDIS and self.redis is not None else self.log_dir / f"{name}.log"

    def dead(self) -> list[str]:
        return [name for name, p in self.processes.items() if p.poll() is not None]

    def supervise(self) -> list[Exit]:
        """One pass: reap every process that exited since the last pass and plan its restart (or
        give it up), then start again those whose backoff is over. Returns the exits it saw."""
        now = time.monotonic()
        exits = [self._exited(name, process, now) for name, process in list(self.processes.items())
                 if name not in self.due and process.poll() is not None]
        for name, due_at in list(self.due.items()):
            if due_at <= now:
                del self.due[name]
                self.restarts[name].append(now)
                self._start(name)
                with self.lock:
                    self.restart_counts[name] = self.restart_counts.get(name, 0) + 1
        return exits

    def _exited(self, name: str, process: subprocess.Popen, now: float) -> Exit:
        recent = [t for t in self.restarts.get(name, []) if now - t < RESTART_WINDOW_S]
        self.restarts[name] = recent
        looping = len(recent) >= MAX_RESTARTS
        with self.lock:
            self.last_exits[name] = describe_exit(process.returncode)
            (self.crash_loops.add if looping else self.crash_loops.discard)(name)
        if looping:
            delay = RESTART_BACKOFF_MAX_S
        else:
            delay = 0.0 if not recent else min(self.backoff_s * 2 ** (len(recent) - 1), RESTART_BACKOFF_MAX_S)
        self.due[name] = now + delay
        return Exit(name, process.pid, process.returncode, delay, len(recent) + 1)

    def states(self) -> list[SupervisedProcess]:
        """What /status shows of each process: its pid (None while it waits to be started again),
        its restarts since `up` started, how it last ended and whether it is in a crash loop."""
        from services.web.status_data import SupervisedProcess

        with self.lock:
            return [SupervisedProcess(name=name, pid=None if name in self.due else p.pid,
                                      restarts=self.restart_counts.get(name, 0), last_exit=self.last_exits.get(name),
                                      crash_loop=name in self.crash_loops)
                    for name, p in self.processes.items()]

    def stop(self, wait_s: float = STOP_WAIT_S) -> None:
        """Stop the Celery workers (SIGTERM: each finishes the task it runs, then SIGKILL after
        `wait_s`); Redis is left to its owner, which stops it after the web."""
        workers = [p for name, p in self.processes.items() if name != REDIS]
        for process in workers:
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + wait_s
        for process in workers:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class WebServer:
    """The Flask app served by werkzeug in a thread of the launcher (no versions in its `Server` header);
    its /status shows `processes`, when given (the launcher's supervised processes). With `log_path`,
    the server's log (a line per request) goes to that file only, not to the launcher's console,
    which shows progress."""

    def __init__(self, settings: Settings, port: int,
                 processes: Callable[[], list[SupervisedProcess]] | None = None, log_path: Path | None = None) -> None:
        from services.web import create_app, status
        from services.web.serving import make_server

        app = create_app(settings)
        if processes is not None:
            status.show_processes(app, processes)
        self.log_handler = _log_only_to(log_path) if log_path is not None else None
        self.server = make_server("127.0.0.1", port, app)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=5)
        if self.log_handler is not None:
            logger = logging.getLogger(WEB_LOGGER)
            logger.removeHandler(self.log_handler)
            logger.propagate = True
            self.log_handler.close()


def _log_only_to(path: Path) -> logging.Handler:
    """The web server's logger writes to `path` (appended) and no longer passes its lines on to the
    root logger's handlers (the console)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    logger = logging.getLogger(WEB_LOGGER)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return handler


def console() -> Console:
    return Console(stderr=True)

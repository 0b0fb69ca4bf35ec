"""A process that has imported what every child needs (torch above all: about 2.5 s of CPU on a
small machine) and forks the evaluator's children from that state, in milliseconds.

The evaluator starts one per process (`ForkServer.get`) with the same scrubbed environment as any
child, and asks it over a socket pair, one request at a time:

- `start`: fork a child. The child makes its own session, takes the pipe the evaluator passed
  (SCM_RIGHTS) as stdin, the end of the evaluator's private channel passed with it as descriptor
  `CLOCK_FD`, and its log as stdout and stderr, closes every other descriptor (the control socket
  included), is confined exactly as one started with `exec` would be (`confine.confine`: limits,
  network and PID namespaces, a private view, `nobody`, subreaper, parent-death signal; the forked
  process stays outside the PID namespace as its shim, whose exit status is the child's), moves to
  its home, replaces its environment, and runs the harness's `main` in place. The reply is its
  pid (the shim's).
- `poll`: reap that child if it has exited; the reply is its exit status as `Popen.returncode`
  reports it (negative: the signal), or null while it runs.

The server itself never runs a job, never touches a GPU (a CUDA context does not survive a fork:
each child creates its own) and holds nothing secret: only code and the paths of the requests.
It is single-threaded when it forks. It dies with the evaluator (parent-death signal); its children
die with it.

It is also the subreaper of everything its children start: a process a child left behind (a
daemon that made its own session, so that killing the child's process group missed it) comes
back to the server when the child ends, and the server kills it (`_kill_strays`). An isolated
child's daemons never do: they end with its PID namespace (`pidns`).
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from shared.process import PR_SET_CHILD_SUBREAPER, PR_SET_DUMPABLE, children_of, libc

HEADER = struct.Struct("!I")
MAX_FDS = 2
CLOCK_FD = 3  # where a forked child holds its end of the evaluator's private channel


def _send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    payload = HEADER.pack(len(data)) + data
    if fds:
        sock.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        sock.sendall(payload)


def _receive(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One message and the descriptors passed with it; (None, []) when the other side is gone."""
    fds: list[int] = []
    head, ancillary, _flags, _addr = sock.recvmsg(HEADER.size, socket.CMSG_SPACE(MAX_FDS * 4))
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += array.array("i", data[: len(data) - len(data) % 4]).tolist()
    if len(head) < HEADER.size:
        for fd in fds:
            os.close(fd)
        return None, []
    (size,) = HEADER.unpack(head)
    body = b""
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk:
            return None, []
        body += chunk
    return json.loads(body), fds


# --- the server process ----------------------------------------------------------------------------


def serve(control_fd: int) -> None:
    # The harness imported once here, both roles and the checker, and inherited by every fork.
    from services.evaluator.harness import checker, main, reference_role  # noqa: F401
    from services.evaluator.sandbox.confine import confine
    from services.evaluator.sandbox.fsview import encoded_view

    import torch

    if torch.cuda.is_initialized():  # a CUDA context does not survive fork(): refuse to serve at all
        raise RuntimeError("the fork server's imports initialised CUDA; children must start as new interpreters")
    lib = libc()
    lib.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    lib.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the candidate's parent: not readable through /proc by it
    control = socket.socket(fileno=control_fd)
    exited: dict[int, int] = {}
    live: set[int] = set()
    while True:
        request, fds = _receive(control)
        if request is None:
            return  # the evaluator closed its end: nothing more to start
        if request["op"] == "start":
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _become_child(request, fds, lambda: confine(
                    request["isolate"], tuple(request["ids"]) if request["ids"] else None, lib,
                    encoded_view(request.get("view", ())), request.get("memory"),
                    os.fsencode(request["cgroup"]) if request.get("cgroup") else None,
                    request.get("pid_namespace", True)))
            for fd in fds:
                os.close(fd)
            live.add(pid)
            _send(control, {"pid": pid})
        elif request["op"] == "poll":
            pid = request["pid"]
            if pid not in exited:
                try:
                    done, status = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done, status = pid, 0
                if done == pid:
                    exited[pid] = os.waitstatus_to_exitcode(status)
                    live.discard(pid)
                    _kill_strays(live)
            _send(control, {"returncode": exited.pop(pid, None)})


def _kill_strays(live: set[int]) -> None:
    """SIGKILL and reap every child of this server that it did not fork itself: what a finished
    child left behind, handed to the subreaper when it ended."""
    for pid in children_of(os.getpid()):
        if pid not in live:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


def _become_child(request: dict[str, Any], fds: list[int], confine) -> None:
    """In the forked child (`fds`: its stdin's pipe, its channel's end); never returns."""
    code = 1
    try:
        os.setsid()
        os.dup2(fds[0], 0)
        os.dup2(fds[1], CLOCK_FD)
        log = os.open(request["log_path"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(CLOCK_FD + 1, min(os.sysconf("SC_OPEN_MAX"), 65536))  # the control socket included
        confine()
        os.chdir(request["workdir"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.stdin = open(0, closefd=False)  # noqa: SIM115  (the process's own stdin, for its job line)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.argv = ["-m services.evaluator.harness", *request["argv"]]
        from services.evaluator.harness import main

        sys.modules["__main__"] = main  # not this server's module: the child sees only the harness
        code = main.main(request["argv"]) or 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


# --- the evaluator's side --------------------------------------------------------------------------


class ForkedProcess:
    """What the sandbox needs of a `Popen` for a child the server forked: its pid, `poll`, `wait`,
    `returncode` and `stdin`. Killing is the sandbox's own (`os.killpg` on the child's session)."""

    def __init__(self, server: ForkServer, pid: int, stdin) -> None:
        self.server, self.pid, self.stdin = server, pid, stdin
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.returncode(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.001
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"child {self.pid}", timeout)
            time.sleep(pause if deadline is None else min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 0.02)
        return self.returncode


class ServerGone(RuntimeError):
    pass


class ForkServer:
    """The evaluator's handle on its server: started on first use, started again if it died."""

    _servers: dict[int, ForkServer] = {}
    _registry = threading.Lock()

    def __init__(self, env: dict[str, str], popen) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.socket = ours
        self.process = popen([sys.executable, "-m", "services.evaluator.sandbox.forkserver", str(theirs.fileno())],
                             env, theirs.fileno())
        theirs.close()
        self._lock = threading.Lock()

    @classmethod
    def get(cls, env: dict[str, str], popen) -> ForkServer:
        """This process's server (`popen(argv, env, fd_to_pass)` starts one when there is none alive)."""
        with cls._registry:
            server = cls._servers.get(os.getpid())
            if server is None or server.process.poll() is not None:
                if server is not None:
                    server.socket.close()  # its children died with it
                server = cls._servers[os.getpid()] = ForkServer(env, popen)
            return server

    def start(self, argv: list[str], workdir: Path, log_path: Path, env: dict[str, str], isolate: bool,
              ids: tuple[int, int] | None, channel: int, view: tuple[tuple[str, bool], ...] = (),
              memory_bytes: int | None = None, cgroup_procs: bytes | None = None,
              pid_namespace: bool = True) -> ForkedProcess:
        """Fork a child; `channel` (a descriptor of this process) becomes its `CLOCK_FD`."""
        read_end, write_end = os.pipe()
        try:
            reply = self._call({"op": "start", "argv": argv, "workdir": str(workdir), "log_path": str(log_path),
                                "env": env, "isolate": isolate, "ids": list(ids) if ids else None,
                                "view": [list(v) for v in view], "memory": memory_bytes,
                                "cgroup": os.fsdecode(cgroup_procs) if cgroup_procs else None,
                                "pid_namespace": pid_namespace},
                               [read_end, channel])
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        return ForkedProcess(self, reply["pid"], os.fdopen(write_end, "wb"))

    def returncode(self, pid: int) -> int | None:
        try:
            return self._call({"op": "poll", "pid": pid})["returncode"]
        except ServerGone:
            return -signal.SIGKILL  # its children died with it (parent-death signal)

    def _call(self, request: dict[str, Any], fds: list[int] | None = None) -> dict[str, Any]:
        with self._lock:
            try:
                _send(self.socket, request, fds)
                reply, _ = _receive(self.socket)
            except OSError as error:
                raise ServerGone(f"the fork server is gone: {error}") from error
        if reply is None:
            raise ServerGone("the fork server is gone")
        return reply


if __name__ == "__main__":
    serve(int(sys.argv[1]))

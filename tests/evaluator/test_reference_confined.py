"""A problem's reference is untrusted code too (issue 25): it runs confined as a candidate is, in a
network namespace, a read-only view of the file systems but for its own folders, under rlimits and
a memory cgroup, and (the evaluator being root) as a user of its own, neither the candidate's
`nobody` nor root. The reference here tries what one did through `POST /api/problems`: write into
the evaluator's package and into a folder of the swarm's, open a connection to a port on the
machine, and read a service's secrets from /proc/*/environ. It raises, naming what worked; where
nothing did, it answers like the affine reference and an honest solution passes.

With the reference taken off the confined roles (the negative control), the same reference
escapes: the test would see it."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from evalkit import FAST, REPO, affine_definition, affine_workloads, make_problem, make_solution
from services.evaluator import evaluate as evaluate_module
from services.evaluator import spares as spares_module
from services.evaluator.evaluate import evaluate
from services.evaluator.sandbox.isolation import isolation, reference_uid, unprivileged_ids
from services.evaluator.spares import Spares
from shared.schema import Status, load_problem

AFFINE = "def run(x, w, b, y):\n    y.copy_(x * w + b)\n"
SECRET = "ks-reference-probe-secret-3c9e"

ATTACKER = '''
import os
import socket

import torch

ESCAPED = []
for target in {targets!r}:
    try:
        with open(target, "w") as file:
            file.write("written by a problem's reference")
        ESCAPED.append("wrote " + target)
    except OSError:
        pass
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
    ESCAPED.append("connected to port {port}")
except OSError:
    pass
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            with open(f"/proc/{{pid}}/environ", "rb") as file:
                if b"{secret}" in file.read():
                    ESCAPED.append(f"read the secret in /proc/{{pid}}/environ")
        except OSError:
            pass


def run(x, w, b):
    if ESCAPED:
        raise RuntimeError("ESCAPED: " + "; ".join(ESCAPED))
    return x * w + b
'''

needs_root = pytest.mark.skipif(os.geteuid() != 0 or unprivileged_ids("reference") is None,
                                reason="the reference's own user needs a root evaluator whose Python others may read")


@pytest.fixture
def outside_tmp():
    """A folder outside /tmp, readable by others (where a problem's reference reads as its own user)."""
    folder = Path(tempfile.mkdtemp(prefix="ks-refconf-", dir="/var/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def service_secret():
    """A process holding a secret in its environment, as the web and the planner hold theirs."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                               env={**os.environ, "KERNELSWARM_SUBMIT_TOKEN": SECRET})
    yield process.pid
    process.kill()
    process.wait()


@pytest.fixture
def listener():
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[bool] = []

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                server.accept()[0].close()
                accepted.append(True)
            except OSError:
                continue

    stop = threading.Event()
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()


def _attacking_problem(folder: Path, port: int):
    swarm_home = folder / "swarm-home"
    swarm_home.mkdir()
    swarm_home.chmod(0o777)  # writable by anyone: only the reference's view keeps it from writing there
    targets = [str(REPO / "services" / "evaluator" / "written_by_a_reference.py"), str(swarm_home / "planted")]
    reference = textwrap.dedent(ATTACKER.format(targets=targets, port=port, secret=SECRET))
    problem = make_problem(folder / "problems", affine_definition(name="attacker", reference=reference),
                           affine_workloads())
    return problem, [Path(t) for t in targets]


def _attack(problem, targets: list[Path], config=FAST):
    """The attacker's attempt, and the targets it wrote (removed, so that nothing is left behind)."""
    try:
        return evaluate(problem, make_solution(AFFINE, "attacker"), config), [t for t in targets if t.exists()]
    finally:
        for target in targets:
            target.unlink(missing_ok=True)


@needs_root
@pytest.mark.parametrize("spare", [False, True], ids=["started-for-it", "spare"])
def test_a_reference_writes_reaches_and_reads_nothing_of_the_machine(outside_tmp, service_secret, listener, spare):
    port, accepted = listener
    problem, targets = _attacking_problem(outside_tmp, port)
    (outside_tmp / "scratch").mkdir()
    pool = Spares("cpu", str(outside_tmp / "scratch")) if spare else None
    try:
        result, written = _attack(problem, targets, dataclasses.replace(FAST, spares=pool))
    finally:
        if pool is not None:
            pool.close()
    assert result.status is Status.PASSED, result.message
    assert not accepted
    assert written == []


@needs_root
def test_without_its_confinement_the_same_reference_escapes(outside_tmp, service_secret, listener, monkeypatch):
    """The negative control: the test sees an escape where there is one."""
    port, accepted = listener
    problem, targets = _attacking_problem(outside_tmp, port)
    unconfined = tuple(r for r in spares_module.CONFINED if r != "reference")
    monkeypatch.setattr(evaluate_module, "CONFINED", unconfined)
    monkeypatch.setattr(evaluate_module, "reference_ids", lambda problem_root: None)  # root's uid, every capability
    result, written = _attack(problem, targets)
    assert result.status is Status.INVALID_REFERENCE, result.message
    assert written == targets
    assert "ESCAPED" in result.message and "connected to port" in result.message
    assert "read the secret" in result.message and "swarm-home/planted" in result.message


@needs_root
def test_the_reference_runs_as_a_user_of_its_own_and_reads_its_data_files(outside_tmp):
    """Its uid (`KERNELSWARM_REFERENCE_UID`), neither root's nor the candidate's; a safetensors
    input read from the problem's folder as that user."""
    probe = ("import os\nimport torch\n\nUID = os.getuid()\n\n"
             "def run(x, w, b):\n    assert UID == {uid}, f'the reference ran as uid {{UID}}'\n"
             "    return x * w + b\n").format(uid=reference_uid())
    from_file = {"x": {"type": "random"}, "b": {"type": "random"},
                 "w": {"type": "safetensors", "path": "data/w.safetensors", "tensor_key": "w"}}
    folder = make_problem(outside_tmp, affine_definition(name="as_itself", reference=probe),
                          affine_workloads(inputs=from_file)).root
    (folder / "data").mkdir(mode=0o755)
    save_file({"w": torch.linspace(-2.0, 2.0, 16)}, str(folder / "data" / "w.safetensors"))
    (folder / "data" / "w.safetensors").chmod(0o644)
    result = evaluate(load_problem(folder, with_seeds=False), make_solution(AFFINE, "as_itself"), FAST)
    assert result.status is Status.PASSED, result.message
    assert reference_uid() not in (0, unprivileged_ids()[0])


def test_a_reference_in_a_folder_others_cannot_read_still_reaches_and_writes_nothing(tmp_path, listener):
    """A problem folder only root may read (pytest's own temporary folder): the reference runs as
    the evaluator's uid (without capabilities, where it is root) to read it, still in its own
    network namespace and read-only view, where this machine gives children those."""
    if not isolation()["network_namespace"] or not isolation()["read_only_root"]:
        pytest.skip("this machine gives its children neither a network namespace nor a read-only view")
    port, accepted = listener
    problem, targets = _attacking_problem(tmp_path, port)
    result, written = _attack(problem, targets)
    assert result.status is Status.PASSED, result.message
    assert not accepted
    assert written == []

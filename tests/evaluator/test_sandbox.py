"""The sandbox's process handling: children die with the evaluator that started them."""

from __future__ import annotations

import json
import shutil
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from services.evaluator.sandbox import fsview
from shared.process import running

REPO = Path(__file__).resolve().parents[2]

# A stand-in evaluator: starts children that would run for ten minutes (a new interpreter, trusted
# and isolated; the evaluator's own child forked by its fork server, trusted and isolated, waiting
# for a job that never comes), prints their pids, then waits to be killed.
EVALUATOR = textwrap.dedent("""
    import sys, threading, time
    from pathlib import Path
    from services.evaluator.sandbox.isolation import start_child

    home = Path(sys.argv[1])
    spin = ["-c", "import time\\nwhile True: time.sleep(0.05)"]
    waiting = ["-m", "services.evaluator.harness", "--wait", "cpu"]
    children = []  # kept: a waiting child's job pipe closes with its handle
    def start(args, isolate, name):  # from threads, as the evaluator's attempts may
        children.append(start_child(args, home, home / f"{name}.log", isolate=isolate))
    threads = [threading.Thread(target=start, args=(a, i, f"{n}{i}"))
               for n, a in (("spin", spin), ("wait", waiting)) for i in (False, True)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    print(*[c.process.pid for c in children], flush=True)
    time.sleep(600)
""")


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_children_die_when_their_evaluator_is_killed(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o777)  # the isolated child may run as `nobody`
    evaluator = subprocess.Popen([sys.executable, "-c", EVALUATOR, str(home)], cwd=REPO, stdout=subprocess.PIPE,
                                 text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        pids = [int(p) for p in evaluator.stdout.readline().split()]
        assert len(pids) == 4 and all(running(p) for p in pids)
        evaluator.send_signal(signal.SIGKILL)
        evaluator.wait()
        deadline = time.monotonic() + 60
        while any(running(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [p for p in pids if running(p)], "a child outlived its evaluator"
    finally:
        evaluator.kill()
        evaluator.wait()
        evaluator.stdout.close()
        for pid in pids if "pids" in locals() else []:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _wait_child(home: Path, name: str):
    from services.evaluator.sandbox.isolation import finish_child, start_child

    child = start_child(["-m", "services.evaluator.harness", "--wait", "cpu"], home, home / f"{name}.log")
    run = finish_child(child, "", 60)  # an empty job line: the spare exits 0 unused
    child.channel.close()
    return child, run


def test_a_dead_fork_server_is_replaced_and_a_missing_one_falls_back_on_new_interpreters(tmp_path, monkeypatch):
    from services.evaluator.sandbox import forkserver, isolation as sandbox

    home = tmp_path / "home"
    home.mkdir()
    child, run = _wait_child(home, "first")
    assert isinstance(child.process, forkserver.ForkedProcess) and run.exit_code == 0
    server = forkserver.ForkServer._servers[os.getpid()]
    server.process.kill()
    server.process.wait()
    child, run = _wait_child(home, "second")  # a new server
    assert isinstance(child.process, forkserver.ForkedProcess) and run.exit_code == 0
    assert forkserver.ForkServer._servers[os.getpid()] is not server

    def gone(*args, **kwargs):
        raise forkserver.ServerGone("no fork server here")

    monkeypatch.setattr(sandbox.ForkServer, "get", gone)
    child, run = _wait_child(home, "third")
    assert isinstance(child.process, subprocess.Popen) and run.exit_code == 0


def test_without_the_fork_server_an_attempt_runs_in_new_interpreters(affine):
    import dataclasses

    from evalkit import FAST, make_solution
    from services.evaluator.evaluate import evaluate
    from shared.schema import Status

    solution = make_solution("import torch\n\ndef run(x, w, b, y):\n    y.copy_(x * w + b)\n", affine.name)
    result = evaluate(affine, solution, dataclasses.replace(FAST, fork_server=False))
    assert result.status is Status.PASSED, result.message


def test_fork_server_false_starts_a_new_interpreter(tmp_path):
    from services.evaluator.sandbox.isolation import finish_child, start_child

    child = start_child(["-m", "services.evaluator.harness", "--wait", "cpu"], tmp_path, tmp_path / "c.log",
                        fork_server=False)
    assert isinstance(child.process, subprocess.Popen)
    assert finish_child(child, "", 60).exit_code == 0
    child.channel.close()


PROBE = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    try:
        Path(f"/proc/{os.getppid()}/environ").read_bytes()
        parent = True
    except OSError:
        parent = False
    import mmap, resource
    try:  # beyond its address space: refused at once; a mapping never touched costs nothing if not
        mmap.mmap(-1, int(sys.argv[2]) + (1 << 30)).close()
        allocated = True
    except OSError:
        allocated = False
    def writable(folder):
        try:
            (Path(folder) / "planted").write_text("x")
            return True
        except OSError:
            return False
    Path("probe.json").write_text(json.dumps({
        "elsewhere_writable": writable(sys.argv[3]), "own_writable": writable(os.getcwd()),
        "address_space": resource.getrlimit(resource.RLIMIT_AS)[0], "allocated_beyond": allocated,
        "oom_score_adj": int(Path("/proc/self/oom_score_adj").read_text()),
        "uid": os.getuid(), "capabilities": int(status["CapEff"], 16) | int(status["CapPrm"], 16),
        "bounding": int(status["CapBnd"], 16), "code_writable": os.access(sys.argv[1], os.W_OK),
        "parent_environ": parent}))
""")


@pytest.mark.skipif(os.geteuid() != 0, reason="as a user without privileges the candidate runs as that user, "
                                               "with limits only (docs/deploy.md)")
def test_an_isolated_child_has_no_capabilities_no_writable_code_and_no_view_of_its_parent(tmp_path):
    """A bounded address space (on a CPU device: an allocation beyond it fails, not the machine).
    As `nobody` or, where `nobody` cannot run the interpreter, as root without capabilities; either
    way in a mount namespace where all but its own folders is read-only (a folder beside its home
    that anyone may write included), and its parent (here: this process, which made itself not
    dumpable when it started the child) is closed to it."""
    from services.evaluator.sandbox.isolation import (
        PACKAGE_ROOT, finish_child, isolation, memory_limit, start_child, unprivileged_ids,
    )

    tmp_path.chmod(0o777)  # where it runs as `nobody`, its home must be writable by it
    tmp_path.parent.chmod(0o711)  # and reachable, as an attempt's folder is (`hand_over_folders`)
    limit = memory_limit("cpu")
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"  # beside its home: the next attempt's, say
    elsewhere.mkdir(mode=0o777)
    elsewhere.chmod(0o777)  # writable by `nobody` too: only the read-only view can stop it
    child = start_child(["-c", PROBE, str(PACKAGE_ROOT / "services" / "evaluator"), str(limit), str(elsewhere)],
                        tmp_path, tmp_path / "c.log", isolate=True, fork_server=False, memory_bytes=limit)
    run = finish_child(child, "", 60)
    child.channel.close()
    assert run.exit_code == 0, run.log
    probe = json.loads((tmp_path / "probe.json").read_text())
    assert probe["uid"] == (unprivileged_ids() or (0, 0))[0]
    keeps_root = unprivileged_ids() is None  # then what stands in for `nobody`, where this machine allows it
    if not keeps_root or isolation()["no_capabilities"]:
        assert probe["capabilities"] == 0 and (probe["bounding"] == 0 or not keeps_root)
        assert not probe["parent_environ"]
    if not keeps_root or isolation()["read_only_root"]:
        assert not probe["code_writable"]
    if isolation()["read_only_root"]:  # nothing but its own folders, whoever it runs as
        assert probe["own_writable"] and not probe["elsewhere_writable"], probe
        assert not (elsewhere / "planted").exists()
    assert probe["address_space"] == limit and not probe["allocated_beyond"]  # a CPU device's bound
    assert probe["oom_score_adj"] == 1000  # the OOM killer's first choice, whatever the device


@pytest.mark.skipif(os.geteuid() != 0, reason="becomes `nobody` to play an evaluator that is not root")
def test_a_candidate_of_an_evaluator_that_is_not_root_writes_only_its_folders_and_has_no_network():
    """An evaluator that is not root cannot mount or make namespaces itself; its candidate gets a
    user namespace of its own (where the machine allows one): its network is private, everything
    but its own folder is read-only (the code, and a folder anyone may write), and it cannot make
    it writable again. Played here by a forked process that becomes `nobody`, checks that it can
    write both folders, then confines itself as the candidate's child would."""
    import errno
    import socket

    from services.evaluator.sandbox import confine
    from shared.process import libc

    outer = Path(tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    outer.chmod(0o755)  # under a folder `nobody` may enter (pytest's own is root's, 0700)
    code, home = outer / "code", outer / "home"
    for folder in (code, home):
        folder.mkdir()
        folder.chmod(0o777)  # writable by `nobody` before: only the confinement can stop it
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    lib = libc()
    pid = os.fork()
    if pid == 0:  # the stand-in evaluator's candidate
        failed = 0
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            probe = os.fork()  # whether this kernel lets `nobody` have a user namespace at all
            if probe == 0:
                os._exit(0 if lib.unshare(confine.CLONE_NEWUSER) == 0 else 1)
            if os.waitstatus_to_exitcode(os.waitpid(probe, 0)[1]) != 0:
                os._exit(77)
            (code / "before.py").write_text("x = 0\n")  # it can, before
            confine.confine(True, None, lib, ((str(outer).encode(), False), (str(home).encode(), True)))
            (home / "mine.py").write_text("x = 2\n")  # its own folder stays writable (else: 99)
            try:
                (code / "planted.py").write_text("x = 1\n")
                failed |= 1
            except OSError as error:
                failed |= 0 if error.errno == errno.EROFS else 8
            connection = socket.socket()
            try:
                connection.settimeout(2)
                connection.connect(("127.0.0.1", port))  # a numeric address: no codec to import as `nobody`
                failed |= 2
            except OSError:
                pass
            finally:
                connection.close()
            flags = fsview.MS_BIND | fsview.MS_REMOUNT | fsview._kept_flags(b"/")
            if lib.mount(None, b"/", None, flags, None) == 0 or fsview._set_read_only(b"/", False, lib):
                failed |= 4  # made writable again
        except BaseException:  # noqa: BLE001 - anything else is a failure of the test's own
            import traceback

            traceback.print_exc()
            failed = 99
        os._exit(failed)
    _, status = os.waitpid(pid, 0)
    server.close()
    planted = (code / "planted.py").exists()
    shutil.rmtree(outer)
    outcome = os.waitstatus_to_exitcode(status)
    if outcome == 77:
        pytest.skip("this machine forbids user namespaces to unprivileged users")
    assert outcome == 0, {1: "code writable", 2: "network reachable", 4: "could remount it writable",
                          8: "not refused as a read-only file system"}.get(outcome, outcome)
    assert not planted


def _refused(path: Path) -> bool:
    try:
        path.write_text("x")
        return False
    except OSError:
        return True


def _read_only(path: str) -> bool:
    """Whether `path`'s mount is read-only (asked of statvfs: nothing is written to find out)."""
    return bool(os.statvfs(path).f_flag & os.ST_RDONLY)


def _proc_read_only_but_processes() -> bool:
    """/proc as a CUDA candidate sees it: its own entries on a writable mount, every other entry
    (the kernel's settings, sysrq-trigger, the drivers') read-only."""
    others = [e for e in os.listdir("/proc") if not e.isdigit() and not os.path.islink(f"/proc/{e}")]
    return (not _read_only(f"/proc/{os.getpid()}") and "sys" in others
            and all(_read_only(f"/proc/{e}") for e in others))


def _in_private_view(own: Path, view: tuple[tuple[bytes, bool], ...], checks, before=lambda: None) -> int:
    """The exit code of a forked process that works in `own`, takes `view` (`fsview.private_view`:
    90 where it cannot) and runs `checks`, which returns a bitmask of failures (99: it raised)."""
    from shared.process import libc

    lib = libc()
    pid = os.fork()
    if pid == 0:
        failed = 0
        try:
            before()
            os.chdir(own)
            if not fsview.private_view(view, lib):
                os._exit(90)
            Path("mine").write_text("x")  # its own folder, by a relative path (its working directory)
            failed = checks()
        except BaseException:  # noqa: BLE001 - anything else is a failure of the test's own
            import traceback

            traceback.print_exc()
            failed = 99
        os._exit(failed)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a mount namespace, as a root evaluator's candidate does")
@pytest.mark.parametrize("mount_setattr", [True, False], ids=["mount_setattr", "one_remount_per_mount"])
def test_the_private_view_leaves_only_its_own_folders_writable(tmp_path: Path, mount_setattr: bool) -> None:
    """`fsview.private_view` in a forked process: its own folder writable, its attempt's folder visible
    and read-only, another attempt's folder beside it gone from view, /tmp and /dev/shm empty and
    its own, and the code read-only; with `mount_setattr` and, where a kernel or a seccomp filter
    refuses that call, with one remount per mount (the call's number made unknown here)."""
    from services.evaluator.sandbox import isolation as sandbox

    if not sandbox.isolation()["read_only_root"]:
        pytest.skip("no mount namespace here")
    scratch = Path(tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    attempt, other = scratch / "ks-att-mine", scratch / "ks-att-other"
    own = attempt / "cand"
    for folder in (own, other):
        folder.mkdir(parents=True)
    (attempt / "inputs").mkdir()
    (other / "secret").write_text("x")
    (tmp_path / "shared").write_text("x")

    def without_mount_setattr() -> None:
        if not mount_setattr:
            fsview.MOUNT_SETATTR_SYSCALL = 1 << 20  # ENOSYS: the fallback

    def checks() -> int:
        failed = 0 if _refused(attempt / "inputs" / "planted") else 1
        failed |= 0 if _refused(sandbox.PACKAGE_ROOT / "planted.py") else 2
        failed |= 0 if not other.exists() and not (tmp_path / "shared").exists() else 4
        failed |= 0 if _refused(Path("/proc/self/comm")) and _read_only("/proc/sys") else 8
        Path("/tmp/private").write_text("x")  # its own /tmp and /dev/shm, empty
        if os.path.isdir("/dev/shm"):
            Path("/dev/shm/private").write_text("x")
        return failed

    outcome = _in_private_view(own, ((str(attempt).encode(), False), (str(own).encode(), True)), checks,
                               without_mount_setattr)
    mine = (own / "mine").exists()
    leaked = [p for p in (Path("/tmp/private"), Path("/dev/shm/private"), attempt / "inputs" / "planted") if p.exists()]
    shutil.rmtree(scratch)
    assert outcome == 0, {1: "its attempt's folder writable", 2: "the code writable", 4: "other folders in view",
                          8: "/proc writable", 90: "no private view"}.get(outcome, outcome)
    assert mine and not leaked


def test_mountinfo_paths_are_unescaped() -> None:

    assert fsview._unescaped(b"/mnt/a\\040b\\011c") == b"/mnt/a b\tc"
    assert fsview._unescaped(b"/plain\\") == b"/plain\\"


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.isdir("/dev/shm"), reason="makes a mount namespace over /dev/shm")
def test_on_a_cuda_device_proc_entries_of_processes_stay_writable_and_dev_shm_private() -> None:
    """`shared_folders("cuda")`: /proc's entries of processes stay writable (CUDA's driver writes to
    its own at cuInit), the rest of /proc does not; /dev/shm and /tmp are its own as on a CPU (a
    file left in the real /dev/shm would outlive the attempt, in memory, outside its cgroup's
    reach), and its attempt's folder stays read-only."""
    from services.evaluator.sandbox import isolation as sandbox

    if not sandbox.isolation()["read_only_root"]:
        pytest.skip("no mount namespace here")
    assert sandbox.shared_folders("cuda:0") == ("/proc",) and sandbox.shared_folders("cpu") == ()
    scratch = Path(tempfile.mkdtemp(dir="/dev/shm"))
    scratch.chmod(0o755)  # reachable by `nobody`, as an attempt's scratch is
    attempt = scratch / "ks-att-mine"
    own = attempt / "cand"
    own.mkdir(parents=True)
    (attempt / "inputs").mkdir()
    view = fsview.encoded_view(sandbox.candidate_view((own,), sandbox.shared_folders("cuda")))
    assert view[0] == (b"/proc", True)

    def checks() -> int:
        Path("/dev/shm/private-cuda").write_text("x")  # its own /dev/shm, gone with its namespace
        Path("/tmp/private-cuda").write_text("x")
        Path("/proc/self/comm").write_text("candidate")  # its own entries in /proc: writable
        failed = 0 if _refused(attempt / "inputs" / "planted") else 1
        return failed | (0 if _proc_read_only_but_processes() else 2)

    outcome = _in_private_view(own, view, checks)
    seen = [(own / "mine").exists(), Path("/dev/shm/private-cuda").exists(), Path("/tmp/private-cuda").exists()]
    shutil.rmtree(scratch)
    assert outcome == 0, {1: "its attempt's folder writable", 2: "/proc's other entries writable",
                          90: "no private view"}.get(outcome, outcome)
    assert seen == [True, False, False]


def test_code_in_a_scratch_folder_stays_importable_and_read_only(monkeypatch) -> None:
    """A library on the import path below /tmp (a wheel unpacked there, a virtual environment):
    the candidate's private /tmp would hide it, so the view binds it back in, read-only; a folder
    holding the candidate's own is never bound (it would show the attempts beside it)."""
    from services.evaluator.sandbox import isolation as sandbox
    from services.evaluator.sandbox.confine import enter_user_namespace
    from shared.process import libc

    if not sandbox.isolation()["read_only_root"]:
        pytest.skip("no mount namespace here")
    library = Path(tempfile.mkdtemp(dir="/tmp"))
    (library / "ks_probe_module.py").write_text("VALUE = 7\n")
    scratch = Path(tempfile.mkdtemp(dir="/tmp"))
    own = scratch / "ks-att-mine" / "cand"
    own.mkdir(parents=True)
    monkeypatch.setenv("PYTHONPATH", f"{library}{os.pathsep}{scratch}")
    view = fsview.encoded_view(sandbox.candidate_view((own,)))
    assert (str(library).encode(), False) in view and not any(p == str(scratch).encode() for p, _ in view)

    def checks() -> int:
        seen = (library / "ks_probe_module.py").read_text() == "VALUE = 7\n"
        return (0 if seen else 1) | (0 if _refused(library / "planted.py") else 2)

    def as_a_candidate() -> None:  # where the evaluator is not root: in a user namespace of its own
        if os.geteuid() != 0:
            enter_user_namespace(libc())

    outcome = _in_private_view(own, view, checks, as_a_candidate)
    planted = (library / "planted.py").exists()
    shutil.rmtree(library)
    shutil.rmtree(scratch)
    assert outcome == 0, {1: "the library hidden", 2: "the library writable",
                          90: "no private view"}.get(outcome, outcome)
    assert not planted


SET_LIMIT_UNDER_A_LOWER_HARD_LIMIT = r"""
import os, resource, sys
sys.path.insert(0, sys.argv[1])
from services.evaluator.sandbox.confine import set_limit
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 512), 512))  # the evaluator's own, lower hard limit
if os.geteuid() == 0:
    os.setgid(65534)
    os.setuid(65534)  # not root: the hard limit cannot be raised again
try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
    print("raised", flush=True)
except ValueError:
    print("refused", flush=True)
set_limit(resource.RLIMIT_NOFILE, 4096)
print(resource.getrlimit(resource.RLIMIT_NOFILE))
"""


def test_a_child_limit_above_the_evaluators_own_hard_limit_keeps_the_lower_one() -> None:
    """Issue 25: an evaluator under a tighter RLIMIT_NOFILE than the sandbox's 4096 (not root) had
    every confined child end on `setrlimit`'s refusal, recorded as the solution's RUNTIME_ERROR.
    `set_limit` keeps the evaluator's lower limit instead."""
    done = subprocess.run([sys.executable, "-c", SET_LIMIT_UNDER_A_LOWER_HARD_LIMIT, str(REPO)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["refused", "(512, 512)"]

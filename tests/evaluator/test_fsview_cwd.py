"""A private view whose caller works in a folder the view does not hold (a checkout under /tmp,
which the view covers with an empty tmpfs of its own) still applies: the child's working directory
becomes the root instead of the view failing. This is why the sandbox's tests and `isolation()`
depended on where the checkout lives."""

from __future__ import annotations

import ctypes
import os
import tempfile
from pathlib import Path

import pytest

from services.evaluator.sandbox import fsview


@pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace needs root here")
def test_a_view_made_from_a_working_directory_it_hides_applies_and_moves_to_the_root():
    lib = ctypes.CDLL(None, use_errno=True)
    probe = os.fork()
    if probe == 0:
        os._exit(0 if lib.unshare(fsview.CLONE_NEWNS) == 0 else 77)
    if os.waitstatus_to_exitcode(os.waitpid(probe, 0)[1]) == 77:
        pytest.skip("this machine gives no mount namespace")
    hidden = Path(tempfile.mkdtemp(dir="/tmp"))  # under /tmp, not in the view: covered by its tmpfs
    own = Path(tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"))
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            os.chdir(hidden)
            applied = fsview.private_view(((os.fsencode(own), True),), lib)
            code = 0 if applied and os.getcwd() == "/" and not (Path("/tmp") / hidden.name).exists() else 1
            (own / "written").write_text("ok")
        except BaseException:  # noqa: BLE001 - any other failure is the test's
            code = 98
        os._exit(code)
    outcome = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    written = (own / "written").exists()
    for folder in (hidden, own):
        for f in folder.iterdir():
            f.unlink()
        folder.rmdir()
    assert outcome == 0 and written, outcome

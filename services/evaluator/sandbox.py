"""Run a child process with a scrubbed environment, its own session and a hard timeout.

The child gets only what it needs (PATH, a private HOME and TMPDIR, the import path of this
package, the GPU it may use); the parent kills the whole process group when time runs out.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
PASS_THROUGH = ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CUDA_HOME", "OMP_NUM_THREADS", "LANG")
LOG_TAIL_CHARS = 8000


@dataclass(frozen=True)
class ChildRun:
    exit_code: int | None
    timed_out: bool
    elapsed_s: float
    log: str


def scrubbed_env(home: Path) -> dict[str, str]:
    # The import path: this package, then where the parent's own PYTHONPATH found its libraries.
    python_path = os.pathsep.join([str(PACKAGE_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(home),
           "PYTHONPATH": python_path, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
    env.update({k: os.environ[k] for k in PASS_THROUGH if k in os.environ})
    return env


def run_child(args: list[str], workdir: Path, timeout_s: float, log_path: Path) -> ChildRun:
    """`python -m <args>` in `workdir`; stdout and stderr go to `log_path`."""
    started = time.monotonic()
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, *args], cwd=workdir, env=scrubbed_env(workdir),
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        timed_out = False
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(process)
    return ChildRun(process.returncode, timed_out, time.monotonic() - started, _tail(log_path))


def _kill_group(process: subprocess.Popen) -> None:
    """Kill the child and anything it started; reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _tail(path: Path) -> str:
    data = path.read_bytes()[-LOG_TAIL_CHARS:]
    return data.decode(errors="replace")

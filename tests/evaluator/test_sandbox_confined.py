"""The evaluator confined as docker-compose.yml runs it: root with SYS_ADMIN in a container that is not
privileged, where Docker mounts the cgroup file systems read-only and AppArmor's `docker-default`
profile refuses `mount`. `confine.c` (beside this file) plays that container on this machine: a
mount namespace whose cgroup mounts are read-only, and a seccomp filter that answers mount(2) and
its newer relatives with EACCES. docs/deploy.md says what the evaluator does there; this checks it:

- `isolation()` says what is lost (`read_only_root`, `host_memory_cgroup`) and what is kept (the
  network namespace, the limits);
- a candidate is still started, says in its log that it has no private view, and can then write a
  folder outside its own that anyone may write (the known cost, docs/deploy.md);
- attempts still run: an honest solution PASSES, a patched timer is REWARD_HACK.

The same driver runs unconfined too, so that the confined answers are the helper's doing and not
this machine's. Needs root (the helper makes a mount namespace) and a C compiler.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

DRIVER = r'''
import json
import sys
from pathlib import Path

sys.path[:0] = [sys.argv[2], sys.argv[3]]
from evalkit import FAST, affine_definition, affine_workloads, make_problem, make_solution
from services.evaluator.sandbox import isolation as sandbox
from services.evaluator.evaluate import evaluate

root = Path(sys.argv[1])
report = {"isolation": sandbox.isolation()}
home, elsewhere = root / "home", root / "elsewhere"
for folder in (home, elsewhere):
    folder.mkdir()
    folder.chmod(0o777)  # writable by whoever the candidate runs as: only a read-only view can stop it
probe = "import sys\nfrom pathlib import Path\nPath(sys.argv[1], 'planted').write_text('here')\n"
child = sandbox.start_child(["-c", probe, str(elsewhere)], home, root / "child.log", isolate=True,
                            fork_server=False)
run = sandbox.finish_child(child, "", 60)
child.channel.close()
report["child_log"] = run.log[-2000:]
report["elsewhere_written"] = (elsewhere / "planted").exists()
problem = make_problem(root / "problems", affine_definition(), affine_workloads())
honest = make_solution("""
    import torch

    def run(x, w, b, y):
        torch.mul(x, w, out=y)
        y.add_(b)
""")
patched = make_solution("""
    import time

    import torch

    time.perf_counter = lambda: 0.0

    def run(x, w, b, y):
        torch.mul(x, w, out=y)
        y.add_(b)
""", name="patches_the_timer")
report["honest"] = evaluate(problem, honest, FAST).status.value
report["patched_timer"] = evaluate(problem, patched, FAST).status.value
print(json.dumps(report))
'''


@pytest.fixture(scope="module")
def confine(tmp_path_factory) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.fail("no C compiler (cc or gcc) to build tests/evaluator/confine.c")
    binary = tmp_path_factory.mktemp("confine") / "confine"
    subprocess.run([compiler, "-O2", "-Wall", "-Werror", "-o", str(binary), str(HERE / "confine.c")], check=True)
    return binary


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A folder `nobody` can reach, as an attempt's folder is (pytest's own are 0700 from the top)."""
    folder = Path(tempfile.mkdtemp(prefix="ks-confined-", dir="/var/tmp"))
    folder.chmod(0o711)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def drive(tmp_path: Path, prefix: list[str]) -> dict:
    root = tmp_path / ("confined" if prefix else "unconfined")
    root.mkdir()
    root.chmod(0o711)  # reachable by `nobody`, as an attempt's folder is
    script = root / "driver.py"
    script.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([*prefix, sys.executable, str(script), str(root), str(REPO), str(HERE)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(os.geteuid() != 0, reason="the helper makes a mount namespace, which needs root")
def test_confined_as_in_the_compose_container_the_evaluator_says_what_it_lost_and_still_runs(confine, reachable):
    free = drive(reachable, [])
    assert free["isolation"]["read_only_root"] and free["isolation"]["host_memory_cgroup"], free["isolation"]
    assert not free["elsewhere_written"] and "no private view here" not in free["child_log"], free
    assert free["honest"] == "PASSED" and free["patched_timer"] == "REWARD_HACK", free

    boxed = drive(reachable, [str(confine)])
    isolation = boxed["isolation"]
    assert not isolation["read_only_root"] and not isolation["host_memory_cgroup"], isolation
    assert isolation["network_namespace"] and isolation["limits"], isolation
    assert "no private view here" in boxed["child_log"], boxed["child_log"]
    assert boxed["elsewhere_written"], boxed  # the cost docs/deploy.md names: files outside its folders
    assert boxed["honest"] == "PASSED" and boxed["patched_timer"] == "REWARD_HACK", boxed

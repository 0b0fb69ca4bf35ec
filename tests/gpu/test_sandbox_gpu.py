"""The candidate's private view on a GPU machine (`services/evaluator/sandbox/isolation.py`): CUDA's driver
initialises inside it. On the H200 a view with /proc wholly read-only failed cuInit with CUDA
error 304 in every candidate (the driver writes to its own process's entries), hence
`SHARED_ON_CUDA`.

Run on the GPU machine: `pytest -m gpu tests/gpu/test_sandbox_gpu.py`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from test_cuda_language import config, problem  # noqa: E402,F401 - shared fixtures

# In a new interpreter (CUDA must not have been initialised before the view is taken, and this
# test's own process has): take the candidate's view, its identity, then cuInit. Exit codes: the
# CUDA error, 90 where no view could be taken, 91 where /proc's other entries stayed writable.
PROBE = """
import ctypes, os, sys
from pathlib import Path
from services.evaluator.sandbox import fsview, isolation as sandbox
lib = ctypes.CDLL(None, use_errno=True)
own = Path(sys.argv[1])
os.chdir(own)
view = fsview.encoded_view(sandbox.candidate_view((own,), sandbox.shared_folders("cuda")))
if not fsview.private_view(view, lib):
    sys.exit(90)
if not os.statvfs("/proc/sys").f_flag & os.ST_RDONLY:
    sys.exit(91)
ids = sandbox.unprivileged_ids()
if ids is not None:
    os.setgroups([]); os.setgid(ids[1]); os.setuid(ids[0])
Path("mine").write_text("x")
cuda = ctypes.CDLL("libcuda.so.1")
count = ctypes.c_int(0)
error = cuda.cuInit(0) or cuda.cuDeviceGetCount(ctypes.byref(count))
sys.exit(error or (0 if count.value > 0 else 92))
"""


def test_cuda_initialises_in_the_candidates_view() -> None:
    from services.evaluator.sandbox import isolation as sandbox

    if os.geteuid() != 0 or not sandbox.isolation()["read_only_root"]:
        pytest.skip("the private view needs a root evaluator with mount namespaces here")
    scratch = Path(tempfile.mkdtemp(dir="/dev/shm"))
    own = scratch / "ks-att-gpu" / "cand"
    own.mkdir(parents=True)
    os.chmod(own, 0o777)  # the candidate may be `nobody`
    run = subprocess.run([sys.executable, "-c", PROBE, str(own)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(sandbox.PACKAGE_ROOT),
                                                                          os.environ.get("PYTHONPATH", "")])})
    wrote = (own / "mine").exists()
    shutil.rmtree(scratch)
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert wrote


HOG = """
import mmap

import torch


def run(x, w, y):
    block = mmap.mmap(-1, 8 << 30)
    for offset in range(0, 8 << 30, 4096):
        block[offset] = 1
    torch.mul(x, w, out=y)
"""


def test_a_gpu_candidate_over_its_host_memory_bound_is_stopped_and_the_next_passes(problem, config, monkeypatch):
    """On a GPU no address-space limit applies (the driver reserves far more than the host has):
    only the candidate's memory cgroup (`memcap`) bounds its host memory. On the H200 machine the
    evaluator's own cgroup is a leaf with processes in it, so the cgroups are made below an ancestor."""
    from services.evaluator.sandbox import memcap, isolation as sandbox
    from services.evaluator.evaluate import evaluate
    from shared.schema import Status
    from test_gpu_hacks import pytorch_solution

    if not sandbox.isolation()["host_memory_cgroup"]:
        pytest.skip("no memory cgroup this evaluator may make here")
    monkeypatch.setattr(memcap, "bound_bytes", lambda: 3 << 30)
    hog = evaluate(problem, pytorch_solution("host_hog", HOG), config)
    assert hog.status is Status.RUNTIME_ERROR, hog.message
    assert "host-memory bound of 3.0 GiB" in hog.message, hog.message
    honest = evaluate(problem, pytorch_solution("honest", "import torch\n\n\ndef run(x, w, y):\n"
                                                          "    torch.mul(x, w, out=y)\n"), config)
    assert honest.status is Status.PASSED, honest.message


def test_a_gpu_reference_runs_as_a_user_of_its_own_and_checks_outputs_handed_over_in_gpu_memory(
        problem, config):
    """The reference, confined with its own uid, makes its CUDA context and computes on the GPU; the
    candidate (`nobody`) hands its outputs over in GPU memory (CUDA IPC between two users, neither
    the evaluator's), and wrong outputs handed over so still fail."""
    import dataclasses
    import json

    from services.evaluator.evaluate import evaluate
    from services.evaluator.sandbox.isolation import unprivileged_ids
    from shared.schema import Status, load_problem
    from test_cuda_language import GOOD, REFERENCE, cuda_solution

    ids = unprivileged_ids("reference")
    if os.geteuid() != 0 or ids is None:
        pytest.skip("the reference's own user needs a root evaluator whose Python others may read")
    root = Path(tempfile.mkdtemp(prefix="as-itself-", dir=problem.root.parent))
    root.chmod(0o755)
    definition = json.loads((problem.root / "definition.json").read_text())
    definition["reference"] = REFERENCE.replace(
        "def run(x, w):\n", f"def run(x, w):\n    assert os.getuid() == {ids[0]}, os.getuid()\n"
                            "    assert x.is_cuda\n").replace("import torch\n", "import os\n\nimport torch\n")
    (root / "definition.json").write_text(json.dumps(definition))
    shutil.copy(problem.root / "workload.jsonl", root / "workload.jsonl")
    as_itself = load_problem(root)
    clocked = dataclasses.replace(config, outer_clock=True, gpu_handover=True)
    good = evaluate(as_itself, cuda_solution(GOOD), clocked)
    assert good.status is Status.PASSED, good.message
    assert "export" in good.child_phases["candidate"], good.child_phases
    wrong = evaluate(as_itself, cuda_solution(GOOD.replace("mul.rn.f32", "add.rn.f32"), "scale_wrong"), clocked)
    assert wrong.status is Status.INCORRECT_NUMERICAL, wrong.message

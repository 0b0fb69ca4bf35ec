"""What the profiled process runs under (`tools.profile._run_ncu`), checked with a stand-in for
ncu: a small program of ours at ncu's place in the command, which looks at the world it was given,
writes what it saw, and prints a raw CSV page as ncu would. Where the evaluator runs as root (CI
does), it must see a network with only its loopback, up; write its own folder only; and the page
it wrote must come back as the profile's text. Not as root, only the limits and the text apply."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest

from services.evaluator.config import EvalConfig
from services.evaluator.tools.profile import _Kept, _run_ncu
from shared.schema import load_problem
from test_profile_text import page

PROBLEMS = Path(__file__).resolve().parents[2] / "problems"
PROBLEM = load_problem(PROBLEMS / "llama31_8b_rmsnorm")

STAND_IN = '''#!{python}
import fcntl, json, os, resource, socket, struct, sys
args = sys.argv[1:]
log = args[args.index("--log-file") + 1]
home = os.path.dirname(log)
seen = {{"argv": args, "names": [name for _index, name in socket.if_nameindex()]}}
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    flags = struct.unpack("16sh", fcntl.ioctl(s, 0x8913, struct.pack("16sh", b"lo", 0)))[1]
seen["lo_up"] = bool(flags & 1)
for where in (os.path.dirname(home), {repo!r}):
    try:
        with open(os.path.join(where, "written-by-profile"), "w") as f:
            f.write("x")
        seen[where] = "written"
    except OSError as error:
        seen[where] = error.strerror
with open(os.path.join(home, "mine"), "w") as f:
    f.write("x")
seen["own"] = "written"
seen["nofile"] = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
seen["environ"] = sorted(os.environ)
with open(os.path.join(home, "seen.json"), "w") as f:
    json.dump(seen, f)
with open(log, "w") as f:
    f.write({page!r})
'''


def run_stand_in(tmp_path: Path) -> tuple[tuple, dict]:
    folder = tmp_path / "prof"
    folder.mkdir()
    tool = folder / "ncu"
    repo = str(Path(__file__).resolve().parents[2])
    tool.write_text(STAND_IN.format(python=sys.executable, repo=repo, page=page()))
    tool.chmod(0o755)
    kept = _Kept(plan={"steps": []}, cubin=b"\x7fELF not a real one")
    problem = dataclasses.replace(PROBLEM, workloads=PROBLEM.workloads[:1])
    done = _run_ncu(folder, problem, PROBLEM.seed("cuda"), EvalConfig(device="cuda:0"), kept, str(tool), 3350.0)
    seen = json.loads((folder / "home" / "seen.json").read_text())
    return done, seen


def test_the_page_ncu_wrote_comes_back_as_the_profile_text(tmp_path):
    (status, text), seen = run_stand_in(tmp_path)
    assert status is None, text
    assert "one call: 2 launches" in text and "DRAM 85.0% (2848 of 3350 GB/s)" in text
    argv = seen["argv"]
    assert argv[argv.index("--profile-from-start") + 1] == "off"
    assert argv[-3:-1] == ["-m", "services.evaluator.tools.target"] and argv[-1].endswith("job.json")
    job = json.loads(Path(argv[-1]).read_text())  # the target's job, beside its home
    assert job["workload"]["uuid"] == PROBLEM.workloads[0].uuid and job["cubin_path"].endswith("kernels.cubin")
    assert seen["nofile"] == 4096  # the sandbox's limits
    assert "OPENAI_API_KEY" not in seen["environ"] and set(seen["environ"]) <= {
        "PATH", "HOME", "TMPDIR", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED", "CUDA_VISIBLE_DEVICES",
        "LD_LIBRARY_PATH", "CUDA_HOME", "OMP_NUM_THREADS", "LANG", "LC_CTYPE"}


@pytest.mark.skipif(os.geteuid() != 0, reason="the network namespace and the private view need root")
def test_as_root_it_has_its_own_loopback_and_writes_its_own_folder_only(tmp_path):
    (_status, _text), seen = run_stand_in(tmp_path)
    assert seen["names"] == ["lo"] and seen["lo_up"]
    assert seen["own"] == "written"
    repo = str(Path(__file__).resolve().parents[2])
    assert seen[str(tmp_path / "prof")] != "written" and seen[repo] != "written"
    assert not (Path(repo) / "written-by-profile").exists() and not (tmp_path / "prof" / "written-by-profile").exists()

"""Issue 25's reference and fault cases, tried on whichever checkout is first on PYTHONPATH (one
line per case), for docs/results/hardening.md's before/after table:

    PYTHONPATH=<checkout> python bench/reference_faults_probe.py

- `wrong shape`: a reference returning (n, 8) for a (n, 16) output, judged with an honest solution;
- `sleeping reference`: a reference that sleeps, with `workload_timeout_s` 2 s and a reference limit
  of 30 s (the old code took the larger of the attempt's 60 s and the reference's);
- `input sets, file size limit`: RLIMIT_FSIZE of 1 MiB (a full disk's stand-in) while the
  reference saves 4 MiB input sets;
- `2**31 const axis`: `kernelswarm problems validate` of a problem with a const axis of 2**31;
- `escaping reference`: a reference that, at import, writes into the evaluator's package and into a
  folder anyone may write (a stand-in for the swarm's home), connects to a port on 127.0.0.1 where
  the probe listens, and looks for a secret in every /proc/*/environ (a process beside it holds it,
  as the web holds its token); it raises naming what worked, else answers. Its problem folder is in
  /var/tmp, readable by others (what a reference of its own user needs; that also needs a Python
  that others may read);
- `no CUDA context`: an attempt on device `cuda` of a machine without CUDA.
Runs on a CPU; each case in a process of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# `escaping reference`: the attacker's reference, filled in by the case's process.
ATTACKER = '''import os, socket
import torch
DONE = []
for t in TARGETS:
    try:
        open(t, "w").write("x")
        DONE.append("wrote " + "/".join(t.split("/")[-2:]))
    except OSError:
        pass
try:
    socket.create_connection(("127.0.0.1", PORT), timeout=2).close()
    DONE.append("connected to its port")
except OSError:
    pass
for pid in os.listdir("/proc"):
    try:
        if pid.isdigit() and SECRET.encode() in open("/proc/" + pid + "/environ", "rb").read():
            DONE.append("read the secret")
    except OSError:
        pass

def run(x, w, b):
    if DONE:
        raise RuntimeError("ESCAPED: " + "; ".join(sorted(set(DONE))))
    return x * w + b
'''

ESCAPE = r"""
import os, shutil, socket, subprocess, sys, tempfile, threading, time
from pathlib import Path
sys.path.insert(0, sys.argv[1] + "/tests/evaluator")
from evalkit import FAST, affine_definition, affine_workloads, make_problem, make_solution
from services.evaluator.evaluate import evaluate
secret = "probe-secret-81f0"
holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env={**os.environ, "PROBE_TOKEN": secret})
server = socket.create_server(("127.0.0.1", 0))
port = server.getsockname()[1]
threading.Thread(target=server.accept, daemon=True).start()
root = Path(tempfile.mkdtemp(prefix="ks-probe-", dir="/var/tmp"))
root.chmod(0o755)
home = root / "home"
home.mkdir()
home.chmod(0o777)
targets = [sys.argv[1] + "/services/evaluator/written_by_a_reference.py", str(home / "planted")]
code = f"TARGETS, PORT, SECRET = {targets!r}, {port}, {secret!r}\n" + sys.argv[2]
problem = make_problem(root / "p", affine_definition(name="probe", reference=code), affine_workloads())
started = time.monotonic()
try:
    result = evaluate(problem, make_solution("def run(x, w, b, y):\n    y.copy_(x * w + b)\n", "probe"), FAST)
    message = result.message[result.message.find("ESCAPED"):] if "ESCAPED" in result.message else result.message
    said = f"{result.status.value} after {time.monotonic() - started:.1f} s: {message[:200]}"
finally:
    holder.kill()
    for t in targets:
        Path(t).unlink(missing_ok=True)
    shutil.rmtree(root, ignore_errors=True)
print(" ".join(said.split()))
"""

# `no CUDA context`: device `cuda` on a machine without CUDA.
NO_CUDA = r"""
import dataclasses, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, sys.argv[1] + "/tests/evaluator")
from evalkit import FAST, affine_definition, affine_workloads, make_problem, make_solution
from services.evaluator.evaluate import evaluate
problem = make_problem(Path(tempfile.mkdtemp()), affine_definition(name="probe"), affine_workloads())
started = time.monotonic()
try:
    result = evaluate(problem, make_solution("def run(x, w, b, y):\n    y.copy_(x * w + b)\n", "probe"),
                      dataclasses.replace(FAST, device="cuda"))
    said = f"{result.status.value} after {time.monotonic() - started:.1f} s: {result.message[:160]}"
except Exception as error:
    said = f"{type(error).__name__} (no verdict) after {time.monotonic() - started:.1f} s: {str(error)[:160]}"
print(" ".join(said.split()))
"""

CASE = r"""
import dataclasses, resource, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1] + "/tests/evaluator")
from evalkit import FAST, TOLERANCE, affine_definition, make_problem, make_solution
from services.evaluator.evaluate import evaluate
case, root = sys.argv[2], Path(sys.argv[3])
reference = {"wrong shape": "return (x * w + b)[:, :8]", "sleeping reference": "time.sleep(600)\n    return x * w + b",
             "input sets, file size limit": "return x * w + b"}[case]
definition = affine_definition(name="probe", reference=f"import time\nimport torch\n\ndef run(x, w, b):\n    {reference}\n")
n = 65536 if case == "input sets, file size limit" else 7
spec = {k: {"type": "random"} for k in "xwb"}
problem = make_problem(root, definition, [{"uuid": "w", "axes": {"n": n}, "inputs": spec, "tolerance": TOLERANCE["float32"]}])
config = dataclasses.replace(FAST, regenerate_inputs=False, fork_server=False, workload_timeout_s=2.0,
                             scratch_dir=root / "scratch")
fields = {f.name for f in dataclasses.fields(config)}
if "reference_timeout_s" in fields:
    config = dataclasses.replace(config, reference_timeout_s=30.0)
if case == "input sets, file size limit":
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
started = time.monotonic()
try:
    result = evaluate(problem, make_solution("def run(x, w, b, y):\n    y.copy_(x * w + b)\n", "probe"), config)
    said = f"{result.status.value} after {time.monotonic() - started:.1f} s: {result.message[:160]}"
except Exception as error:
    said = f"{type(error).__name__} (no verdict) after {time.monotonic() - started:.1f} s: {str(error)[:160]}"
print(" ".join(said.split()))
"""

HUGE = {"name": "huge", "axes": {"n": {"type": "var"}, "k": {"type": "const", "value": 2**31}},
        "inputs": {"x": {"shape": ["k"], "dtype": "float32"}, "w": {"shape": ["n"], "dtype": "float32"}},
        "outputs": {"y": {"shape": ["k"], "dtype": "float32"}}, "reference": "def run(x, w):\n    return x\n"}


def main() -> None:
    checkout = next((p for p in sys.path if (Path(p) / "services" / "evaluator").is_dir()), str(Path.cwd()))
    for case in ("wrong shape", "sleeping reference", "input sets, file size limit"):
        with tempfile.TemporaryDirectory() as tmp:
            done = subprocess.run([sys.executable, "-c", CASE, checkout, case, tmp], capture_output=True, text=True,
                                  timeout=900, cwd=checkout)
            said = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else f"exit {done.returncode}: " \
                   + " ".join(done.stderr.split())[-200:]
            print(f"{case:28} {said}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "huge"
        folder.mkdir()
        (folder / "definition.json").write_text(json.dumps(HUGE))
        (folder / "workload.jsonl").write_text(json.dumps({"uuid": "w", "axes": {"n": 8}, "inputs": {
            "x": {"type": "random"}, "w": {"type": "random"}}}) + "\n")
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "kernelswarm.cli", "problems", "validate", str(folder)],
                              capture_output=True, text=True, timeout=300, cwd=checkout)
        said = " ".join(done.stderr.replace(str(folder), "<folder>").split())[:220]
        print(f"{'2**31 const axis':28} exit {done.returncode} after {time.monotonic() - started:.1f} s: {said}")
    for case, script, extra in (("escaping reference", ESCAPE, [ATTACKER]), ("no CUDA context", NO_CUDA, [])):
        done = subprocess.run([sys.executable, "-c", script, checkout, *extra], capture_output=True, text=True,
                              timeout=600, cwd=checkout)
        said = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else f"exit {done.returncode}: " \
            + " ".join(done.stderr.split())[-200:]
        print(f"{case:28} {said}", flush=True)


if __name__ == "__main__":
    main()

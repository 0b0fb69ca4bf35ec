"""One-shot `kernelswarm eval` as a user runs it: wall time of the command, and what it reads for
the problem's own reference submitted as a solution (issue 28: the same code should read about 1x).

    python bench/eval_oneshot.py --device cuda --problem problems/llama31_8b_rmsnorm \
        --solution problems/llama31_8b_rmsnorm/solutions/cuda_seed.json --max-workloads 3 \
        --tree base=.base --tree this=. --repeat 3 --out oneshot.json

Each tree (a checkout of the project: `git worktree add .base <commit>` for an older one) runs the
same commands with its own code and a home of its own, so that each keeps its own build cache and
baselines: the first call of a tree fills them (`cold`), the next ones are what a user sees after
that (`cached`). With `--self-compare` the problem's reference, as a `pytorch` solution returning its
outputs, is evaluated too, `--repeat` times per tree: its speedup per workload (the median's ratio)
shows whether the reference and a candidate are timed alike. Prints a table; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path


def reference_solution(problem: Path) -> dict:
    definition = json.loads((problem / "definition.json").read_text())
    return {"name": "reference-as-solution", "definition": definition["name"], "author": "bench",
            "spec": {"languages": ["pytorch"], "target_hardware": ["LOCAL"], "entry_point": "main.py::run",
                     "destination_passing_style": False},
            "sources": [{"path": "main.py", "content": definition["reference"]}]}


def run_eval(tree: Path, home: Path, problem: Path, solution: Path, device: str, max_workloads: int | None) -> dict:
    command = [sys.executable, "-c", "from kernelswarm.cli import main; raise SystemExit(main())", "eval",
               str(problem), "--solution", str(solution), "--device", device, "--json"]
    if max_workloads:
        command += ["--max-workloads", str(max_workloads)]
    env = {**os.environ, "KERNELSWARM_HOME": str(home), "COLUMNS": "120",
           "PYTHONPATH": os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH")) if p)}
    began = time.perf_counter()
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - began
    traces = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    ratios = {}
    for trace in traces:
        performance = trace["evaluation"].get("performance") or {}
        if performance.get("latency_ms") and performance.get("reference_latency_ms"):
            ratios[trace["workload"]["uuid"]] = performance["reference_latency_ms"] / performance["latency_ms"]
    statuses = sorted({t["evaluation"]["status"] for t in traces})
    return {"wall_s": round(wall, 2), "exit": done.returncode, "statuses": statuses, "ratios": ratios,
            "load_1min": round(os.getloadavg()[0], 2),
            "stderr_tail": done.stderr[-1500:] if done.returncode not in (0, 1) or not traces else ""}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--problem", type=Path, required=True)
    parser.add_argument("--solution", type=Path, help="timed for wall time (cold, then cached)")
    parser.add_argument("--max-workloads", type=int)
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH (default: this=.)")
    parser.add_argument("--repeat", type=int, default=2, help="cached calls per tree")
    parser.add_argument("--self-compare", type=int, default=0, metavar="N",
                        help="evaluate the problem's reference as a solution N times per tree")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree) or {"this": "."}
    work = Path(tempfile.mkdtemp(prefix="ks-oneshot-"))
    mirror = work / "reference.json"
    mirror.write_text(json.dumps(reference_solution(args.problem)))
    rows: list[dict] = []
    for name, path in trees.items():
        tree, home = Path(path).resolve(), work / f"home-{name}"
        problem = (tree / args.problem) if not args.problem.is_absolute() else args.problem
        if args.solution is not None:
            solution = (tree / args.solution) if not args.solution.is_absolute() else args.solution
            for k in range(1 + args.repeat):
                row = {"tree": name, "case": "cold" if k == 0 else "cached", "solution": solution.name,
                       **run_eval(tree, home, problem, solution, args.device, args.max_workloads)}
                rows.append(row)
                print(json.dumps(row), flush=True)
        for k in range(args.self_compare):
            row = {"tree": name, "case": "self", "solution": mirror.name,
                   **run_eval(tree, home, problem, mirror, args.device, args.max_workloads)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{'tree':8} {'case':7} {'solution':24} {'wall s':>7} {'exit':>4} {'load':>5}  speedups (reference / solution)")
    for r in rows:
        speedups = " ".join(f"{v:.2f}" for v in r["ratios"].values())
        print(f"{r['tree']:8} {r['case']:7} {r['solution'][:24]:24} {r['wall_s']:7.2f} {r['exit']:4} "
              f"{r['load_1min']:5.2f}  {speedups}")
    summary = {}
    for name in trees:
        cached = [r["wall_s"] for r in rows if r["tree"] == name and r["case"] == "cached"]
        self_ratios = [v for r in rows if r["tree"] == name and r["case"] == "self" for v in r["ratios"].values()]
        summary[name] = {"cached_wall_median_s": statistics.median(cached) if cached else None,
                         "self_ratio_median": statistics.median(self_ratios) if self_ratios else None,
                         "self_ratio_range": [min(self_ratios), max(self_ratios)] if self_ratios else None}
        print(f"{name}: cached wall median {summary[name]['cached_wall_median_s']} s; self-comparison "
              f"median {summary[name]['self_ratio_median']} range {summary[name]['self_ratio_range']}")
    if args.out:
        args.out.write_text(json.dumps({"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                        "command": " ".join(sys.argv), "rows": rows, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

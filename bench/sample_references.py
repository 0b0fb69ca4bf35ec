"""Every SOL-ExecBench sample problem evaluates its own reference as a `pytorch` solution.

    python bench/sample_references.py --samples ../shared/sol-execbench-sample --device cuda \
        --max-workloads 3 --out references.json

The solution is the definition's reference, unchanged, returning its outputs
(destination_passing_style false). Expected: PASSED, or a clear error where data is missing.
Prints a table; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from services.evaluator.evaluate import EvalConfig, evaluate
from shared.schema import Problem, Solution, load_problem
from shared.schema.problem import find_problems


def reference_solution(problem: Problem) -> Solution:
    return Solution.model_validate({
        "name": f"{problem.name}_reference", "definition": problem.name, "author": "reference",
        "spec": {"languages": ["pytorch"], "target_hardware": ["LOCAL"], "entry_point": "reference.py::run",
                 "destination_passing_style": False},
        "sources": [{"path": "reference.py", "content": problem.definition.reference}]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=Path, default=Path("../shared/sol-execbench-sample"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--max-workloads", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("references.json"))
    args = parser.parse_args()
    config = EvalConfig(device=args.device, correctness_rounds=2, timing_sets=1, warmup_runs=2, timing_runs=10,
                        timing_budget_s=0.3, attempt_timeout_s=240)
    rows = []
    for folder in find_problems([args.samples]):
        problem = load_problem(folder)
        started = time.perf_counter()
        result = evaluate(problem, reference_solution(problem), config, args.max_workloads)
        statuses = [t.evaluation.status.value for t in result.traces]
        rows.append({"problem": f"{folder.parent.name}/{folder.name}", "status": result.status.value,
                     "workloads": statuses, "wall_s": round(time.perf_counter() - started, 1),
                     "message": result.message.strip().splitlines()[-1][:200] if result.message.strip() else ""})
        print(f"{rows[-1]['problem'][:60]:60} {result.status.value:20} {rows[-1]['wall_s']:>6.1f} s", flush=True)
    hardware = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    report = {"date": datetime.now(timezone.utc).isoformat(), "hardware": hardware,
              "command": f"python bench/sample_references.py --device {args.device} "
                         f"--max-workloads {args.max_workloads}", "rows": rows}
    args.out.write_text(json.dumps(report, indent=2))
    passed = sum(r["status"] == "PASSED" for r in rows)
    print(f"\n{passed} of {len(rows)} problems PASSED their own reference on {hardware}")
    for r in rows:
        if r["status"] != "PASSED":
            print(f"  {r['problem']}: {r['status']}: {r['message']}")


if __name__ == "__main__":
    main()

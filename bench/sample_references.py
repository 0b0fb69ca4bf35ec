"""Every SOL-ExecBench sample problem evaluates its own reference as a `pytorch` solution.

    python bench/sample_references.py --samples ../shared/sol-execbench-sample --device cuda \
        --max-workloads 3 --out references.json
    python bench/sample_references.py --device cpu --max-workloads 1 --smallest --only L2/043,Quant/

The solution is the definition's reference, unchanged, returning its outputs
(destination_passing_style false). Expected: PASSED, or a clear error where data is missing.
Prints a line per problem (and the end of the message of any that did not pass); the JSON is
rewritten after every problem, so a run that is cut off keeps its rows. `--only` and `--skip`
split a run into parts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from services.evaluator.config import EvalConfig

from services.evaluator.evaluate import evaluate
from shared.schema import Problem, Solution, Workload, load_problem
from shared.schema.problem import find_problems

MESSAGE_LINES = 12  # of a failure's message, printed and kept in the JSON


def reference_solution(problem: Problem) -> Solution:
    return Solution.model_validate({
        "name": f"{problem.name}_reference", "definition": problem.name, "author": "reference",
        "spec": {"languages": ["pytorch"], "target_hardware": ["LOCAL"], "entry_point": "reference.py::run",
                 "destination_passing_style": False},
        "sources": [{"path": "reference.py", "content": problem.definition.reference}]})


def workload_size(problem: Problem, workload: Workload) -> int:
    """Elements of the workload's shaped inputs and outputs: the order `--smallest` takes them in."""
    definition = problem.definition
    axes = definition.resolve_axes(workload.axes)
    specs = [*definition.inputs.values(), *definition.outputs.values()]
    return sum(math.prod(shape) for s in specs if (shape := definition.shape_of(s, axes)) is not None)


def smallest_first(problem: Problem) -> Problem:
    ordered = sorted(problem.workloads, key=lambda w: workload_size(problem, w))
    return dataclasses.replace(problem, workloads=tuple(ordered))


def select(folders: list[Path], only: str | None, skip: int) -> list[Path]:
    """The problems to run: those whose "group/name" contains one of `only`'s comma-separated
    parts (all when none), less the first `skip` of them."""
    wanted = [part.strip() for part in (only or "").split(",") if part.strip()]
    chosen = [f for f in folders if not wanted or any(w in label(f) for w in wanted)]
    return chosen[skip:]


def label(folder: Path) -> str:
    return f"{folder.parent.name}/{folder.name}"


def message_tail(message: str, lines: int = MESSAGE_LINES) -> str:
    return "\n".join(message.strip().splitlines()[-lines:])


def run_one(folder: Path, config: EvalConfig, max_workloads: int, smallest: bool) -> dict:
    problem = load_problem(folder)
    if smallest:
        problem = smallest_first(problem)
    started = time.perf_counter()
    result = evaluate(problem, reference_solution(problem), config, max_workloads)
    return {"problem": label(folder), "status": result.status.value,
            "workloads": [t.evaluation.status.value for t in result.traces],
            "axes": [t.workload.axes for t in result.traces],
            "wall_s": round(time.perf_counter() - started, 1), "message": message_tail(result.message)}


def write_report(path: Path, hardware: str, command: str, rows: list[dict]) -> None:
    report = {"date": datetime.now(timezone.utc).isoformat(), "hardware": hardware, "command": command,
              "rows": rows}
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(report, indent=2))
    tmp.replace(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=Path, default=Path("../shared/sol-execbench-sample"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--max-workloads", type=int, default=3)
    parser.add_argument("--smallest", action="store_true", help="take each problem's smallest workloads first")
    parser.add_argument("--only", help='comma-separated substrings of "group/name"; run only the problems matching one')
    parser.add_argument("--skip", type=int, default=0, help="skip the first N selected problems")
    parser.add_argument("--out", type=Path, default=Path("references.json"))
    args = parser.parse_args()
    config = EvalConfig(device=args.device, correctness_rounds=2, timing_sets=1, warmup_runs=2, timing_runs=10,
                        timing_budget_s=0.3, attempt_timeout_s=240)
    hardware = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    command = (f"python bench/sample_references.py --device {args.device} --max-workloads {args.max_workloads}"
               + (" --smallest" if args.smallest else "") + (f" --only {args.only}" if args.only else "")
               + (f" --skip {args.skip}" if args.skip else ""))
    rows: list[dict] = []
    for folder in select(find_problems([args.samples]), args.only, args.skip):
        rows.append(run_one(folder, config, args.max_workloads, args.smallest))
        row = rows[-1]
        print(f"{row['problem'][:60]:60} {row['status']:20} {row['wall_s']:>6.1f} s", flush=True)
        if row["status"] != "PASSED" and row["message"]:
            print("    " + row["message"].replace("\n", "\n    "), flush=True)
        write_report(args.out, hardware, command, rows)
    passed = sum(r["status"] == "PASSED" for r in rows)
    print(f"\n{passed} of {len(rows)} problems PASSED their own reference on {hardware}")
    for r in rows:
        if r["status"] != "PASSED":
            last = r["message"].splitlines()[-1][:200] if r["message"] else ""
            print(f"  {r['problem']}: {r['status']}: {last}")


if __name__ == "__main__":
    main()

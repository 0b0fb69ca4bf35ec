"""The `cute_dsl` seeds against the `cuda` seeds of the same problems, on a GPU.

    python bench/cute_vs_cuda.py --out cute_vs_cuda.json
    python bench/cute_vs_cuda.py --quick --problems llama31_8b_gemm_o_proj

For each problem with a `cute_dsl` seed (an elementwise op, a row reduction, a tensor-core GEMM):
evaluates that seed and the problem's `cuda` seed where there is one, through bench/library.py's
`measure`, and prints one line per solution: mean latency over the workloads, speedup over the
reference's eager time (geomean over workloads of eager / latency), mean SOL score. Writes the rows
and the per-workload detail as JSON. Needs nvidia-cutlass-dsl where it runs (else the `cute_dsl`
rows are UNSUPPORTED).
"""

from __future__ import annotations

import argparse
import json
import statistics
from datetime import datetime, timezone
from pathlib import Path

import torch

from library import REPO, _geomean, measure  # bench/library.py: how a seed is evaluated and read
from services.evaluator.config import EvalConfig
from services.evaluator.spares import Spares

PROBLEMS = ["gemma3_geglu", "llama31_8b_rmsnorm", "llama31_8b_gemm_o_proj"]
LANGUAGES = {"cute_dsl", "cuda"}


def table_rows(measured: dict) -> list[dict]:
    """One row per solution of a problem, from `measure`'s per-workload entries."""
    rows = []
    for language, seed in sorted(measured["seeds"].items(), key=lambda item: item[0] != "cute_dsl"):
        timed = [w for w in seed["workloads"] if w.get("latency_ms") is not None]
        row = {"problem": measured["problem"], "solution": seed["name"], "language": language,
               "status": seed["status"], "workloads": len(seed["workloads"]), "timed": len(timed)}
        if timed:
            row["mean_latency_ms"] = statistics.mean(w["latency_ms"] for w in timed)
        if timed and all(w.get("eager_ms") for w in timed):
            row["speedup_vs_eager"] = _geomean([w["eager_ms"] / w["latency_ms"] for w in timed])
        if timed and all(w.get("sol_score") is not None for w in timed):
            row["mean_sol_score"] = statistics.mean(w["sol_score"] for w in timed)
        if seed["status"] != "PASSED":
            row["message"] = seed["message"][:500]
        rows.append(row)
    return rows


def render(rows: list[dict]) -> str:
    def cell(row, key, fmt):
        return format(row[key], fmt) if key in row else "–"
    lines = ["| problem | solution | language | status | mean latency ms | speedup vs eager | mean SOL |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['problem']} | {r['solution']} | {r['language']} | {r['status']} | "
              f"{cell(r, 'mean_latency_ms', '.4f')} | {cell(r, 'speedup_vs_eager', '.2f')} | "
              f"{cell(r, 'mean_sol_score', '.2f')} |" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", default=",".join(PROBLEMS), help="comma-separated problem names")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="fewer timed runs")
    parser.add_argument("--out", type=Path, default=Path("cute_vs_cuda.json"))
    args = parser.parse_args()
    spares = Spares(args.device, None)
    config = EvalConfig(device=args.device, correctness_rounds=3, timing_sets=2, warmup_runs=3,
                        timing_runs=10 if args.quick else 50, timing_budget_s=0.5 if args.quick else 2.0,
                        attempt_timeout_s=600, measure_compile=False, spares=spares)
    measured, rows = [], []
    try:
        for name in args.problems.split(","):
            problem = measure(REPO / "problems" / name, config, LANGUAGES)
            measured.append(problem)
            rows += table_rows(problem)
            print("\n".join(render(table_rows(problem)).splitlines()[2:]), flush=True)  # without the header
    finally:
        spares.close()
    hardware = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    report = {"date": datetime.now(timezone.utc).isoformat(), "hardware": hardware,
              "command": "python bench/cute_vs_cuda.py" + (" --quick" if args.quick else "")
              + (f" --problems {args.problems}" if args.problems != ",".join(PROBLEMS) else ""),
              "rows": rows, "measured": measured}
    args.out.write_text(json.dumps(report, indent=1))
    print(f"\n{hardware}\n" + render(rows))


if __name__ == "__main__":
    main()

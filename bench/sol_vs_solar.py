"""Our SOL model in `solar` mode against SOL-ExecBench's published B200 `sol_ms`, per workload.

    python bench/sol_vs_solar.py [--memory-mb 6144] [--time-s 120] --out sol-vs-solar.json

Reads every problem under `--sample` (default `../shared/sol-execbench-sample/`, never copied
into the repository) with its `sol_b200.json` (per workload, in workload.jsonl order), counts each
workload's work in a child under a memory and a time limit (`shared.sol_bounded.count_workloads`,
formulas off; a workload it cannot count is unknown, with the reason), prices it in `solar` mode on the
`B200 @ 1500 MHz (SOLAR)` row and divides by the published `sol_ms`. Also prices `ours` on the B200
datasheet row, for comparison. Prints one row per problem and the distribution; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from services.evaluator.sandbox.counting import SandboxRunner
from shared.hardware import B200, B200_SOLAR_1500MHZ
from shared.schema import load_problem
from shared.sol import SolMode, estimate
from shared.sol_bounded import DEFAULT_MEMORY_MB, DEFAULT_TIME_S, CountLimits, count_workloads

DEFAULT_SAMPLE = Path(__file__).resolve().parents[2] / "shared" / "sol-execbench-sample"
TOLERANCE = 0.20
BINS = ((0.0, 0.5), (0.5, 0.8), (0.8, 0.9), (0.9, 1.1), (1.1, 1.2), (1.2, 2.0), (2.0, math.inf))


def compare_problem(folder: Path, limits: CountLimits) -> dict:
    """Per-workload rows for one problem folder (counted in a child under `limits`), and the
    reasons the others are unknown."""
    problem = load_problem(folder, with_seeds=False)
    published = json.loads((folder / "sol_b200.json").read_text())["workloads"]
    rows, errors = [], {}
    started = time.perf_counter()
    counted = count_workloads(problem.definition, problem.workloads, folder, runner=SandboxRunner(), limits=limits,
                              use_formulas=False)
    peaks = [c.peak_mb for c in counted if c.peak_mb is not None]
    for index, (workload, entry, count) in enumerate(zip(problem.workloads, published, counted, strict=True)):
        if count.work is None:
            errors.setdefault(count.message, count.reason.value)
            continue
        work = count.work
        solar = estimate(work, B200_SOLAR_1500MHZ, SolMode.SOLAR)
        ours = estimate(work, B200, SolMode.OURS)
        rows.append({
            "index": index, "uuid": workload.uuid, "axes": workload.axes,
            "published_sol_ms": entry["sol_ms"], "solar_sol_ms": solar.t_sol_ms, "ours_sol_ms": ours.t_sol_ms,
            "ratio": solar.t_sol_ms / entry["sol_ms"], "ratio_ours": ours.t_sol_ms / entry["sol_ms"],
            "bound": solar.bound.value, "ours_bound": ours.bound.value, "precision": solar.precision.value,
            "matrix_flops": work.total_matrix_flops, "vector_flops": work.vector_flops,
            "bytes": work.bytes_moved, "counted_on": work.counted_on, "peak_mb": count.peak_mb,
        })
    return {"problem": f"{folder.parent.name}/{folder.name}", "workloads": len(problem.workloads),
            "rows": rows, "unknown": [{"reason": r, "message": m} for m, r in errors.items()],
            "unknown_workloads": len(problem.workloads) - len(rows), "peak_mb": max(peaks, default=None),
            "seconds": round(time.perf_counter() - started, 2)}


def distribution(ratios: list[float]) -> dict:
    logs = [math.log(r) for r in ratios]
    quantiles = statistics.quantiles(ratios, n=20) if len(ratios) > 1 else ratios * 19
    return {
        "workloads": len(ratios),
        "within_20pct": sum(abs(r - 1) <= TOLERANCE for r in ratios) / len(ratios),
        "within_10pct": sum(abs(r - 1) <= 0.10 for r in ratios) / len(ratios),
        "median": statistics.median(ratios), "geomean": math.exp(statistics.fmean(logs)),
        "p5": quantiles[0], "p95": quantiles[-1], "min": min(ratios), "max": max(ratios),
        "bins": {f"[{lo}, {hi})": sum(lo <= r < hi for r in ratios) for lo, hi in BINS},
    }


def cpu_description() -> str:
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                 if line.startswith("model name")]
        model = names[0] if names else model
    return f"{model}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, torch {torch.__version__}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sample", type=Path, default=DEFAULT_SAMPLE)
    parser.add_argument("--out", type=Path, default=Path("sol-vs-solar.json"))
    parser.add_argument("--memory-mb", type=int, default=DEFAULT_MEMORY_MB, help="the counting child's limit")
    parser.add_argument("--time-s", type=float, default=DEFAULT_TIME_S, help="counting time per workload")
    args = parser.parse_args()
    limits = CountLimits(args.memory_mb, args.time_s)
    folders = sorted(p for p in args.sample.glob("*/*") if (p / "definition.json").exists())
    started = time.perf_counter()
    problems = []
    print(f"{'problem':62} {'n':>3} {'±20%':>5} {'median':>7} {'min':>6} {'max':>6} {'bound':>13} {'s':>5}")
    for folder in folders:
        result = compare_problem(folder, limits)
        problems.append(result)
        ratios = [r["ratio"] for r in result["rows"]]
        if not ratios:
            print(f"{result['problem'][:62]:62} {0:>3}  unknown ({result['unknown'][0]['reason']}): "
                  f"{result['unknown'][0]['message'][:90]}")
            continue
        bounds = "/".join(sorted({r["bound"] for r in result["rows"]}))
        inside = sum(abs(r - 1) <= TOLERANCE for r in ratios)
        print(f"{result['problem'][:62]:62} {len(ratios):>3} {inside:>5} {statistics.median(ratios):>7.3f} "
              f"{min(ratios):>6.3f} {max(ratios):>6.3f} {bounds:>13} {result['seconds']:>5.1f}")
    ratios = [r["ratio"] for p in problems for r in p["rows"]]
    ours = [r["ratio_ours"] for p in problems for r in p["rows"]]
    report = {
        "date": datetime.now(timezone.utc).isoformat(),
        "hardware": cpu_description(),
        "command": f"python bench/sol_vs_solar.py --memory-mb {args.memory_mb} --time-s {args.time_s:g} --out {args.out}",
        "limits": {"memory_mb": limits.memory_mb, "time_s": limits.time_s},
        "rows_priced_on": {"solar": B200_SOLAR_1500MHZ.name, "ours": B200.name},
        "workloads_published": sum(p["workloads"] for p in problems),
        "workloads_counted": len(ratios),
        "coverage": len(ratios) / max(1, sum(p["workloads"] for p in problems)),
        "unknown": {p["problem"]: p["unknown"] for p in problems if p["unknown"]},
        "peak_mb": max((p["peak_mb"] for p in problems if p["peak_mb"] is not None), default=None),
        "solar": distribution(ratios), "ours": distribution(ours),
        "seconds": round(time.perf_counter() - started, 1), "problems": problems,
    }
    args.out.write_text(json.dumps(report, indent=2))
    solar = report["solar"]
    print(f"\n{solar['workloads']} of {report['workloads_published']} workloads counted "
          f"(coverage {100 * report['coverage']:.1f}%) in {report['seconds']} s, the counting child's peak "
          f"address space {report['peak_mb']} MiB under a {limits.memory_mb} MiB limit; "
          f"ours(solar mode)/published: {100 * solar['within_20pct']:.1f}% within ±20%, "
          f"{100 * solar['within_10pct']:.1f}% within ±10%, median {solar['median']:.3f}, "
          f"geomean {solar['geomean']:.3f}, p5 {solar['p5']:.3f}, p95 {solar['p95']:.3f}")
    print("bins:", ", ".join(f"{k}: {v}" for k, v in solar["bins"].items()))
    print(f"ours mode on the B200 datasheet row / published: median {report['ours']['median']:.3f}, "
          f"{100 * report['ours']['within_20pct']:.1f}% within ±20%")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""The problem library on a GPU: every seed solution of every problem, with T_sol, eager, torch.compile.

    python bench/library.py --out library.json --markdown library.md
    python bench/library.py --quick --problems llama31_8b_rmsnorm,llama31_8b_rope   # correctness pass
    python bench/library.py --resume --out library.json   # go on where a cut-off run stopped
    python bench/library.py --languages cuda --outer-clock --out clock.json   # the outer clock's margins

Per problem: the reference's eager time and torch.compile time (T_b is the faster), T_sol on this
GPU's hardware row, and each seed's latency, speedup over T_b and SOL score, per workload and as the
problem's mean. The summary over problems with a `cuda` seed: geomean speedup of the best seed over
T_b, the share beating T_b, the median SOL score. `--quick` skips torch.compile and times less (a
check that every seed passes). Every passing workload's outer-clock window and allowance go into
the JSON, and the summary gives the largest share of its allowance an honest seed used (above 1
it is called a REWARD_HACK); `--outer-clock` is the run that measures only that (no torch.compile).
Prints a table; writes JSON (and Markdown with --markdown).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from services.evaluator.config import EvalConfig

from services.evaluator.evaluate import evaluate
from services.evaluator.spares import Spares
from shared.schema import load_problem

REPO = Path(__file__).resolve().parents[1]


def measure(problem_dir: Path, config: EvalConfig, languages: set[str] | None = None) -> dict:
    problem = load_problem(problem_dir)
    row: dict = {"problem": problem.name, "workloads": len(problem.workloads), "seeds": {}}
    compiled: dict[str, float | None] = {}
    seeds = [s for s in problem.seeds if languages is None or s.spec.language.value in languages]
    for seed in sorted(seeds, key=lambda s: s.spec.language.value != "pytorch"):
        language = seed.spec.language.value
        seed_config = dataclasses.replace(config, compile_baselines=compiled or None,
                                          measure_compile=config.measure_compile and not compiled)
        started = time.perf_counter()
        result = evaluate(problem, seed, seed_config)
        compiled = compiled or dict(result.compile_ms)
        per_workload = []
        for trace in result.traces:
            ev = trace.evaluation
            entry = {"uuid": trace.workload.uuid, "axes": trace.workload.axes, "status": ev.status.value}
            if ev.performance is not None:
                entry.update(latency_ms=ev.performance.latency_ms, eager_ms=ev.performance.reference_latency_ms,
                             compile_ms=compiled.get(trace.workload.uuid))
            if ev.timing is not None and ev.timing.outer_allowed_ms is not None:
                entry.update(outer_window_ms=ev.timing.outer_window_ms, outer_allowed_ms=ev.timing.outer_allowed_ms)
            if ev.sol is not None:
                entry.update(t_sol_ms=ev.sol.t_sol_ms, t_b_ms=ev.sol.t_baseline_ms, sol_score=ev.sol.score,
                             bound=ev.sol.bound, speedup_vs_tb=ev.sol.t_baseline_ms / ev.performance.latency_ms)
            per_workload.append(entry)
        summary = {"language": language, "name": seed.name, "status": result.status.value,
                   "message": result.message[:1500], "wall_s": round(time.perf_counter() - started, 1),
                   "workloads": per_workload}
        if result.status.value == "PASSED" and all("sol_score" in w for w in per_workload):
            summary["sol_score"] = statistics.mean(w["sol_score"] for w in per_workload)
            summary["speedup_vs_tb"] = _geomean([w["speedup_vs_tb"] for w in per_workload])
        row["seeds"][language] = summary
    return row


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def summarize(rows: list[dict]) -> dict:
    seeded = [r for r in rows if "speedup_vs_tb" in r["seeds"].get("cuda", {})]
    if not seeded:
        return {**clock_summary(rows), "problems_with_cuda_seed_passing": 0}
    best = [max((s for s in r["seeds"].values() if "speedup_vs_tb" in s), key=lambda s: s["speedup_vs_tb"])
            for r in seeded]
    speedups = [b["speedup_vs_tb"] for b in best]
    return {**clock_summary(rows), "problems_with_cuda_seed_passing": len(seeded),
            "geomean_speedup_vs_tb": _geomean(speedups),
            "share_beating_tb": sum(s > 1 for s in speedups) / len(speedups),
            "median_sol_score": statistics.median(b["sol_score"] for b in best)}


def clock_summary(rows: list[dict]) -> dict:
    """Over the workloads the outer clock judged (passed ones carry their figures; a seed called a
    REWARD_HACK by it is counted from its status): the largest window / allowance."""
    shares = [w["outer_window_ms"] / w["outer_allowed_ms"] for r in rows for s in r["seeds"].values()
              for w in s["workloads"] if w.get("outer_allowed_ms")]
    hacks = [f"{r['problem']}/{k}" for r in rows for k, s in r["seeds"].items() if s["status"] == "REWARD_HACK"]
    if not shares and not hacks:
        return {}
    return {"outer_clock_workloads": len(shares), "outer_clock_max_share": max(shares, default=None),
            "outer_clock_median_share": statistics.median(shares) if shares else None,
            "outer_clock_hacks": hacks}


def markdown(report: dict) -> str:
    lines = [f"# Problem library on the {report['hardware']} ({report['date'][:10]})", "",
             f"Command: `{report['command']}`", "",
             "Per problem, means over its workloads; T_b = min(eager, torch.compile) of the reference; "
             "speedup = geomean over workloads of T_b / latency; SOL = mean SOL score.", "",
             "| problem | wl | T_sol ms | eager ms | compile ms | pytorch seed ms | cuda seed ms | cuda vs T_b | "
             "cuda SOL | status |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in report["rows"]:
        seeds = row["seeds"]
        base = next((s for s in seeds.values() if s["workloads"] and "eager_ms" in s["workloads"][0]), None)
        def mean(key, seed):
            values = [w[key] for w in (seed or {}).get("workloads", []) if w.get(key) is not None]
            return f"{statistics.mean(values):.4g}" if values else "–"
        cuda = seeds.get("cuda")
        status = ", ".join(f"{k}: {v['status']}" for k, v in seeds.items())
        lines.append(f"| {row['problem']} | {row['workloads']} | {mean('t_sol_ms', base)} | {mean('eager_ms', base)} "
                     f"| {mean('compile_ms', base)} | {mean('latency_ms', seeds.get('pytorch'))} | "
                     f"{mean('latency_ms', cuda)} | "
                     f"{cuda['speedup_vs_tb']:.2f}x | {cuda['sol_score']:.2f} | {status} |"
                     if cuda and "speedup_vs_tb" in cuda else
                     f"| {row['problem']} | {row['workloads']} | {mean('t_sol_ms', base)} | {mean('eager_ms', base)} "
                     f"| {mean('compile_ms', base)} | {mean('latency_ms', seeds.get('pytorch'))} | "
                     f"{mean('latency_ms', cuda)} | – | – | {status} |")
    s = report["summary"]
    lines += ["", "Summary over problems whose `cuda` seed passed (best seed per problem):", "",
              f"- problems: {s.get('problems_with_cuda_seed_passing', 0)}"]
    if "geomean_speedup_vs_tb" in s:
        lines += [f"- geomean speedup over T_b: {s['geomean_speedup_vs_tb']:.2f}x",
                  f"- share beating T_b: {s['share_beating_tb']:.0%}",
                  f"- median SOL score: {s['median_sol_score']:.2f}"]
    if "outer_clock_workloads" in s:
        lines += [f"- outer clock: {s['outer_clock_workloads']} passing workloads, window / allowance median "
                  f"{s['outer_clock_median_share'] or 0:.2f}, max {s['outer_clock_max_share'] or 0:.2f}; "
                  f"seeds it called REWARD_HACK: {', '.join(s['outer_clock_hacks']) or 'none'}"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", help="comma-separated names (default: every folder under problems/)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="no torch.compile, fewer timed runs")
    parser.add_argument("--languages", help="only seeds in these languages (comma-separated)")
    parser.add_argument("--out", type=Path, default=Path("library.json"))
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--outer-clock", action="store_true",
                        help="a run for the outer clock's margins: torch.compile off")
    parser.add_argument("--resume", action="store_true",
                        help="keep the rows already in --out and measure only the problems it lacks "
                             "(a run split over several calls of a time-limited machine)")
    args = parser.parse_args()
    names = args.problems.split(",") if args.problems else sorted(
        p.name for p in (REPO / "problems").iterdir() if (p / "definition.json").exists())
    spares = Spares(args.device, None)
    config = EvalConfig(device=args.device, correctness_rounds=3, timing_sets=2, warmup_runs=3,
                        timing_runs=10 if args.quick else 50, timing_budget_s=0.5 if args.quick else 2.0,
                        attempt_timeout_s=600, measure_compile=not (args.quick or args.outer_clock),
                        spares=spares)
    rows = json.loads(args.out.read_text())["rows"] if args.resume and args.out.exists() else []
    done = {row["problem"] for row in rows if not row.get("error")}
    rows = [row for row in rows if row["problem"] in done]
    for name in names:
        if name in done:
            continue
        try:
            row = measure(REPO / "problems" / name, config,
                          set(args.languages.split(",")) if args.languages else None)
        except Exception as error:  # one broken folder must not lose the others' results
            row = {"problem": name, "workloads": 0, "seeds": {}, "error": f"{type(error).__name__}: {error}"}
        rows.append(row)
        print(f"{name}: " + ", ".join(f"{k} {v['status']} {v.get('speedup_vs_tb', float('nan')):.2f}x "
                                      f"SOL {v.get('sol_score', float('nan')):.2f} ({v['wall_s']} s)"
                                      for k, v in row["seeds"].items()) + row.get("error", ""), flush=True)
        args.out.write_text(json.dumps({"rows": rows}, indent=1))
    spares.close()
    hardware = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    command = "python bench/library.py" + (" --quick" if args.quick else "") + (
        " --outer-clock" if args.outer_clock else "") + (
        " --resume" if args.resume else "") + (
        f" --languages {args.languages}" if args.languages else "") + (
        f" --problems {args.problems}" if args.problems else "")
    report = {"date": datetime.now(timezone.utc).isoformat(), "hardware": hardware, "command": command,
              "rows": rows, "summary": summarize(rows)}
    args.out.write_text(json.dumps(report, indent=1))
    if args.markdown:
        args.markdown.write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()

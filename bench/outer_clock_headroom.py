"""How much time the outer clock lets a solution hide: its headroom per workload, from a library run.

    python bench/outer_clock_headroom.py docs/results/2026-12-03-outer-clock-library-h200.json \\
        --runs 50 --out headroom.json

Reads the JSON that `bench/library.py --outer-clock` writes (per workload: `outer_window_ms`, the
evaluator's own time around the honest timed batch; `outer_allowed_ms`, the most it would have let
pass; `latency_ms`). The headroom is allowed - window: what a solution forging its result around the
handshake (services/evaluator/outer_clock.py) could leave unreported on that workload and still
pass. Prints, per problem, the smallest headroom and how it compares with `--runs` runs of the
honest kernel; writes JSON. Needs no GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def workloads(report: dict) -> list[dict]:
    """Every seed's workload that the outer clock judged and that passed (it carries the window, the
    allowance and a latency), with its problem: the rows of `bench/library.py`, as its
    `clock_summary` reads them."""
    return [{**w, "problem": r["problem"]} for r in report["rows"] for s in r["seeds"].values()
            for w in s["workloads"] if w.get("outer_allowed_ms") and w.get("latency_ms")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("library_json", type=Path)
    parser.add_argument("--runs", type=int, default=50, help="timed runs per workload to compare with")
    parser.add_argument("--out", type=Path, default=Path("outer-clock-headroom.json"))
    args = parser.parse_args()
    report = json.loads(args.library_json.read_text())
    rows = []
    for w in workloads(report):
        headroom = w["outer_allowed_ms"] - w["outer_window_ms"]
        rows.append({"problem": w["problem"], "uuid": w.get("uuid"), "latency_ms": w["latency_ms"],
                     "window_ms": w["outer_window_ms"], "allowed_ms": w["outer_allowed_ms"],
                     "headroom_ms": headroom, "headroom_over_runs": headroom / (args.runs * w["latency_ms"])})
    if not rows:
        raise SystemExit(f"{args.library_json}: no workload carries outer_window_ms and outer_allowed_ms")
    covered = sum(r["headroom_over_runs"] > 1 for r in rows)
    summary = {"workloads": len(rows), "headroom_min_ms": min(r["headroom_ms"] for r in rows),
               "headroom_median_ms": statistics.median(r["headroom_ms"] for r in rows),
               "latency_median_ms": statistics.median(r["latency_ms"] for r in rows),
               "latency_max_ms": max(r["latency_ms"] for r in rows),
               f"workloads_whose_{args.runs}_runs_fit_in_the_headroom": covered}
    out = {"source": str(args.library_json), "hardware": report.get("hardware"), "runs": args.runs,
           "command": f"python bench/outer_clock_headroom.py {args.library_json} --runs {args.runs}",
           "summary": summary, "rows": rows}
    args.out.write_text(json.dumps(out, indent=2))
    print(f"outer clock headroom, {report.get('hardware')}, from {args.library_json.name}")
    print(f"{'problem':40} {'workloads':>9} {'min headroom ms':>16} {'max latency ms':>15} {'headroom / runs':>16}")
    for problem in sorted({r["problem"] for r in rows}):
        mine = [r for r in rows if r["problem"] == problem]
        print(f"{problem[:40]:40} {len(mine):>9} {min(r['headroom_ms'] for r in mine):>16.1f} "
              f"{max(r['latency_ms'] for r in mine):>15.4f} {min(r['headroom_over_runs'] for r in mine):>16.1f}")
    print(f"\n{covered} of {len(rows)} workloads: {args.runs} runs of the honest kernel fit in the headroom "
          f"(min {summary['headroom_min_ms']:.0f} ms, median {summary['headroom_median_ms']:.0f} ms)")


if __name__ == "__main__":
    main()

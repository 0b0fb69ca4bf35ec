"""What one timed run costs the harness beyond the kernel, and how much that cost varies from run
to run: what a per-run handshake (docs/results/hardening.md, hole 7 (a)) would have to see through.

    python bench/harness_overhead.py --device cuda --out harness-overhead.json \\
        [--problems llama31_8b_rmsnorm,whisper_gelu] [--runs 100]

For each workload of the chosen library problems, each run does what a candidate's harness would do
for a run under such a handshake, with the problem's reference as the kernel: make the run's input
set from a seed of its own (`inputs.make_inputs`), digest and snapshot it, copy it to new addresses
and pre-fill the outputs (the harness's `prepare`), then the timed run itself (on a GPU
`timing._GpuClock.time`: reset, flush, spin, the call, synchronize, CUPTI; on a CPU the call between
two `perf_counter` readings). The wall time of the whole run is read around it; the run's sample is
what the timer reports. Per workload it prints the median and spread of wall - sample (the
overhead): the median absolute deviation, the 10th and 90th percentiles, and the standard error
of the median over the runs (1.2533 x MAD x 1.4826 / sqrt(runs)). A forger hiding a fixed time in
every run shifts that median; the shift a check could see is a few standard errors. Not counted:
the round trip of the handshake itself and the evaluator's seal of each run's outputs. Writes JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.evaluator.harness import timing  # noqa: E402
from services.evaluator.harness.entry import empty_outputs  # noqa: E402
from services.evaluator.harness.guards import snapshot  # noqa: E402
from services.evaluator.harness.inputs import digest, make_inputs  # noqa: E402
from shared.schema import load_problem  # noqa: E402
from shared.sol_count import load_reference  # noqa: E402

PROBLEMS = Path(__file__).resolve().parents[1] / "problems"
DEFAULT = "llama31_8b_rmsnorm,whisper_gelu,vit_attention_softmax"


def measure(problem_dir: Path, device: torch.device, runs: int, max_workloads: int | None) -> list[dict]:
    problem = load_problem(problem_dir)
    definition, reference = problem.definition, load_reference(problem.definition)
    rows = []

    def call(inputs: dict) -> None:
        reference.run(**inputs)

    for workload in problem.workloads[:max_workloads]:
        axes = definition.resolve_axes(workload.axes)
        warm = make_inputs(definition, workload, 1, device, problem.root, reference)
        for _ in range(3):
            call(warm)
        clock = timing._GpuClock(device, 0.0) if device.type == "cuda" else None
        overheads, samples = [], []
        for i in range(runs):
            began = time.perf_counter()
            inputs = make_inputs(definition, workload, 1000 + i, device, problem.root, reference)
            digest(inputs)
            snapshot(inputs)
            fresh = {n: v.clone() if isinstance(v, torch.Tensor) else v for n, v in inputs.items()}
            empty_outputs(definition, axes, device)
            if clock is not None:
                clock.time(lambda _i, fresh=fresh: call(fresh), i)
                sample = clock.samples[-1]
            else:
                start = time.perf_counter()
                call(fresh)
                sample = (time.perf_counter() - start) * 1e3
            wall = (time.perf_counter() - began) * 1e3
            overheads.append(wall - sample)
            samples.append(sample)
        median = statistics.median(overheads)
        mad = statistics.median(abs(o - median) for o in overheads)
        deciles = statistics.quantiles(overheads, n=10)
        rows.append({"problem": definition.name, "workload": workload.uuid, "runs": runs,
                     "kernel_median_ms": statistics.median(samples), "overhead_median_ms": median,
                     "overhead_mad_ms": mad, "overhead_p10_ms": deciles[0], "overhead_p90_ms": deciles[-1],
                     "median_standard_error_ms": 1.2533 * 1.4826 * mad / math.sqrt(runs)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--problems", default=DEFAULT, help="comma-separated folders of problems/")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--workloads", type=int, help="only the first N workloads of each problem")
    parser.add_argument("--out", type=Path, default=Path("harness-overhead.json"))
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: pass --device cpu")
    missing = [p for p in args.problems.split(",") if not (PROBLEMS / p).is_dir()]
    if missing:
        raise SystemExit(f"no such problems under {PROBLEMS}: {', '.join(missing)}")
    if args.runs < 10:
        raise SystemExit("--runs: at least 10, for the percentiles")
    rows = []
    for name in args.problems.split(","):
        rows += measure(PROBLEMS / name, device, args.runs, args.workloads)
    hardware = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    report = {"date": datetime.now(timezone.utc).isoformat(), "hardware": hardware,
              "command": " ".join(["python", *sys.argv]), "rows": rows}
    args.out.write_text(json.dumps(report, indent=2))
    print(f"\nharness overhead per timed run, {hardware}, ms")
    print(f"{'problem':28} {'workload':38} {'kernel':>9} {'overhead':>9} {'MAD':>8} {'p10':>8} {'p90':>8} {'s.e.':>8}")
    for r in rows:
        print(f"{r['problem'][:28]:28} {r['workload'][:38]:38} {r['kernel_median_ms']:>9.4f} "
              f"{r['overhead_median_ms']:>9.4f} {r['overhead_mad_ms']:>8.4f} {r['overhead_p10_ms']:>8.4f} "
              f"{r['overhead_p90_ms']:>8.4f} {r['median_standard_error_ms']:>8.4f}")


if __name__ == "__main__":
    main()

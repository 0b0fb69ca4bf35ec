"""Timing fidelity: the evaluator's latency for a kernel against `triton.testing.do_bench` on the same
kernel, and the spread of the evaluator's own number over repeated attempts.

    python bench/evaluator_fidelity.py --repeats 5 --out fidelity.json

Kernels are `pytorch` solutions of elementwise and matrix problems sized from a few µs to a few ms.
Each repeat is a full attempt (child process, fresh inputs, L2 flush, median of up to 100 runs, each
on an input set of its own: fewer for large inputs, at least 5, as many as 2 GiB of sets hold). do_bench
runs in this process on the same shapes with its own L2 flush; its median is taken. Prints a table;
writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import torch

from services.evaluator.evaluate import EvalConfig, evaluate
from shared.schema import Solution, load_problem

# name -> (reference body, shape axes, dtype, solution body)
KERNELS = {
    "add_64k": ("return x + y", {"m": 256, "n": 256}, "float32", "torch.add(x, y, out=out)"),
    "add_16m": ("return x + y", {"m": 4096, "n": 4096}, "float32", "torch.add(x, y, out=out)"),
    "gemm_2k_bf16": ("return x @ y", {"m": 2048, "n": 2048}, "bfloat16", "torch.matmul(x, y, out=out)"),
    "gemm_4k_bf16": ("return x @ y", {"m": 4096, "n": 4096}, "bfloat16", "torch.matmul(x, y, out=out)"),
    "gemm_8k_bf16": ("return x @ y", {"m": 8192, "n": 8192}, "bfloat16", "torch.matmul(x, y, out=out)"),
    "gemm_32k_8k_bf16": ("return x @ y", {"m": 32768, "n": 8192}, "bfloat16", "torch.matmul(x, y, out=out)"),
}


def write_problem(root: Path, name: str, body: str, axes: dict[str, int], dtype: str) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    definition = {
        "name": name, "axes": {"m": {"type": "var"}, "n": {"type": "var"}},
        "inputs": {"x": {"shape": ["m", "n"], "dtype": dtype}, "y": {"shape": ["n" if "@" in body else "m", "n"],
                                                                     "dtype": dtype}},
        "outputs": {"out": {"shape": ["m", "n"], "dtype": dtype}},
        "reference": f"import torch\n\ndef run(x, y):\n    {body}\n",
    }
    (folder / "definition.json").write_text(json.dumps(definition))
    workload = {"uuid": name, "axes": axes, "inputs": {"x": {"type": "random"}, "y": {"type": "random"}},
                "tolerance": {"max_atol": 1.0, "max_rtol": 0.05, "required_matched_ratio": 0.99}}
    (folder / "workload.jsonl").write_text(json.dumps(workload) + "\n")
    return folder


def solution(name: str, line: str) -> Solution:
    return Solution.model_validate({
        "name": f"{name}_torch", "definition": name, "author": "bench",
        "spec": {"languages": ["pytorch"], "target_hardware": ["LOCAL"], "entry_point": "main.py::run"},
        "sources": [{"path": "main.py", "content": f"import torch\n\ndef run(x, y, out):\n    {line}\n"}]})


def do_bench_ms(line: str, axes: dict[str, int], dtype: str, matmul: bool) -> float:
    import triton.testing

    torch_dtype = getattr(torch, dtype)
    m, n = axes["m"], axes["n"]
    x = torch.randn(m, n, device="cuda", dtype=torch_dtype)
    y = torch.randn(n if matmul else m, n, device="cuda", dtype=torch_dtype)
    out = torch.empty(m, n, device="cuda", dtype=torch_dtype)
    call = {"torch.add(x, y, out=out)": lambda: torch.add(x, y, out=out),
            "torch.matmul(x, y, out=out)": lambda: torch.matmul(x, y, out=out)}[line]
    return float(triton.testing.do_bench(call, warmup=100, rep=500, return_mode="median"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("fidelity.json"))
    parser.add_argument("--kernels", default=",".join(KERNELS), help="comma-separated subset")
    args = parser.parse_args()
    config = EvalConfig(device="cuda", correctness_rounds=1, timing_sets=5, warmup_runs=5, timing_runs=100,
                        timing_budget_s=2.0, attempt_timeout_s=300, timed_bytes=2 << 30)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.kernels.split(","):
            body, axes, dtype, line = KERNELS[name]
            problem = load_problem(write_problem(Path(tmp), name, body, axes, dtype))
            ours = []
            for _ in range(args.repeats):
                result = evaluate(problem, solution(name, line), config)
                if result.status.value != "PASSED":
                    raise SystemExit(f"{name}: {result.status.value}: {result.message}")
                ours.append(result.traces[0].evaluation.performance.latency_ms)
            reference = do_bench_ms(line, axes, dtype, "@" in body)
            median = statistics.median(ours)
            rows.append({"kernel": name, "ours_ms": ours, "ours_median_ms": median, "do_bench_ms": reference,
                         "ratio": median / reference, "spread": max(ours) / min(ours)})
            print(f"{name}: ours {ours} do_bench {reference:.4f}", flush=True)
    report = {"date": datetime.now(timezone.utc).isoformat(), "hardware": torch.cuda.get_device_name(),
              "command": f"python bench/evaluator_fidelity.py --repeats {args.repeats} --kernels {args.kernels}",
              "rows": rows}
    args.out.write_text(json.dumps(report, indent=2))
    print(f"fidelity on {report['hardware']}")
    print(f"{'kernel':14} {'ours ms':>10} {'do_bench ms':>12} {'ours/db':>8} {'max/min':>8}")
    for r in rows:
        print(f"{r['kernel']:14} {r['ours_median_ms']:>10.4f} {r['do_bench_ms']:>12.4f} {r['ratio']:>8.3f} "
              f"{r['spread']:>8.3f}")


if __name__ == "__main__":
    main()

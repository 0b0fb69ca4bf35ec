"""Timing fidelity: the evaluator's latency for a kernel against `triton.testing.do_bench` on the same
kernel, and the spread of the evaluator's own number over repeated attempts.

    python bench/evaluator_fidelity.py --repeats 5 --out fidelity.json

Kernels are `pytorch` solutions of elementwise and matrix problems sized from a few µs to a few ms,
timed in the solution's own process, and a `cuda` solution (a float4 add of our own, `cuda_add_*`),
recorded and replayed by the evaluator's timer process (`services/evaluator/timer/`).
Each repeat is a full attempt (child process, fresh inputs, L2 flush, median of up to 100 runs, each
on an input set of its own: fewer for large inputs, at least 5, as many as 2 GiB of sets hold). do_bench
runs in this process on the same shapes with its own L2 flush; its median is taken. With `--ncu`,
Nsight Compute also times the same call in a process of its own (`ncu --clock-control none`, caches
flushed before each kernel: the default, or not: `--ncu-cache none`): the sum of the kernels'
`gpu__time_duration` per call, median over the profiled calls; it is the kernels' own time on the
GPU, as CUPTI's. Prints a table; writes JSON.
"""

from __future__ import annotations

import argparse
import atexit
import csv
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import torch

from services.evaluator.config import EvalConfig

from services.evaluator.evaluate import evaluate
from shared.schema import Solution, load_problem

# name -> (reference body, shape axes, dtype, solution body)
KERNELS = {
    "add_64k": ("return x + y", {"m": 256, "n": 256}, "float32", "torch.add(x, y, out=out)"),
    "add_1m": ("return x + y", {"m": 1024, "n": 1024}, "float32", "torch.add(x, y, out=out)"),
    "add_4m": ("return x + y", {"m": 2048, "n": 2048}, "float32", "torch.add(x, y, out=out)"),
    "add_8m": ("return x + y", {"m": 4096, "n": 2048}, "float32", "torch.add(x, y, out=out)"),
    "add_16m": ("return x + y", {"m": 4096, "n": 4096}, "float32", "torch.add(x, y, out=out)"),
    "add_64m": ("return x + y", {"m": 8192, "n": 8192}, "float32", "torch.add(x, y, out=out)"),
    "cuda_add_4m": ("return x + y", {"m": 2048, "n": 2048}, "float32", "cuda"),
    "cuda_add_16m": ("return x + y", {"m": 4096, "n": 4096}, "float32", "cuda"),
    "cuda_add_64m": ("return x + y", {"m": 8192, "n": 8192}, "float32", "cuda"),
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


# The `cuda` cases' kernel: one float4 of each input a thread (n a multiple of 4, as every shape here).
ADD4 = r"""
extern "C" __global__ void add4(const float4* __restrict__ x, const float4* __restrict__ y,
                                float4* __restrict__ out, int n4) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4) return;
    float4 a = x[i], b = y[i];
    out[i] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}
"""
ADD4_LAUNCH = """
def run(x, y, out, *, kernels):
    n4 = out.numel() // 4
    kernels.add4(x, y, out, n4, grid=((n4 + 255) // 256,), block=(256,))
"""


def solution(name: str, line: str) -> Solution:
    if line == "cuda":
        return Solution.model_validate({
            "name": f"{name}_cuda", "definition": name, "author": "bench",
            "spec": {"languages": ["cuda"], "target_hardware": ["LOCAL"], "entry_point": "launch.py::run"},
            "sources": [{"path": "launch.py", "content": ADD4_LAUNCH}, {"path": "add4.cu", "content": ADD4}]})
    return Solution.model_validate({
        "name": f"{name}_torch", "definition": name, "author": "bench",
        "spec": {"languages": ["pytorch"], "target_hardware": ["LOCAL"], "entry_point": "main.py::run"},
        "sources": [{"path": "main.py", "content": f"import torch\n\ndef run(x, y, out):\n    {line}\n"}]})


NCU_CALLS = 20
NCU_UNITS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3, "s": 1e3}


def make_tensors(name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Kernel `name`'s inputs x and y (random) and its output, on the GPU."""
    body, axes, dtype, _ = KERNELS[name]
    torch_dtype = getattr(torch, dtype)
    m, n = axes["m"], axes["n"]
    x = torch.randn(m, n, device="cuda", dtype=torch_dtype)
    y = torch.randn(n if "@" in body else m, n, device="cuda", dtype=torch_dtype)
    return x, y, torch.empty(m, n, device="cuda", dtype=torch_dtype)


FUNCTIONS = {"torch.add(x, y, out=out)": torch.add, "torch.matmul(x, y, out=out)": torch.matmul}


def call_on(name: str, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor) -> None:
    """One call of kernel `name`'s solution on these tensors."""
    FUNCTIONS[KERNELS[name][3]](x, y, out=out)


def make_call(name: str):
    x, y, out = make_tensors(name)
    if KERNELS[name][3] == "cuda":  # the solution's own launch.py on its cubin, in this process
        namespace: dict = {}
        exec(ADD4_LAUNCH, namespace)
        kernels = cuda_kernels(name)
        return lambda: namespace["run"](x, y, out, kernels=kernels)
    function = FUNCTIONS[KERNELS[name][3]]
    return lambda: function(x, y, out=out)


def cuda_kernels(name: str):
    """The `cuda` case's cubin, built as the evaluator builds it, loaded by the evaluator's launcher."""
    from services.evaluator.languages.launch import Kernels
    from services.evaluator.languages.nvcc import arch_for, build_cubin

    with tempfile.TemporaryDirectory() as tmp:
        built = build_cubin(solution(name, "cuda"), arch_for(torch.cuda.get_device_capability()), {}, Path(tmp))
    if not built.ok:
        raise SystemExit(f"{name}: nvcc failed: {built.log}")
    kernels = Kernels(built.cubin, torch.device("cuda", torch.cuda.current_device()))
    # pycuda aborts the process at exit while a context it pushed is still current (exit code 6:
    # ncu's target, 2026-12-06): popped first (atexit runs what was registered last first).
    atexit.register(kernels.close)
    return kernels


def do_bench_ms(name: str) -> float:
    import triton.testing

    return float(triton.testing.do_bench(make_call(name), warmup=100, rep=500, return_mode="median"))


def ncu_target(name: str) -> None:
    """Run under ncu: warm up unprofiled, then NCU_CALLS calls inside the profiler range."""
    call = make_call(name)
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for _ in range(NCU_CALLS):
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def ncu_ms(name: str, cache_control: str = "all") -> tuple[float | None, str]:
    """Median per call of the kernels' summed `gpu__time_duration` under Nsight Compute."""
    if shutil.which("ncu") is None:
        return None, "ncu is not on PATH"
    command = ["ncu", "--clock-control", "none", "--cache-control", cache_control, "--profile-from-start", "off",
               "--metrics", "gpu__time_duration.sum", "--csv", sys.executable, __file__, "--ncu-target", name]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    rows = [r for r in csv.DictReader(io.StringIO(done.stdout[done.stdout.find('"ID"'):]))
            if r.get("Metric Name") == "gpu__time_duration.sum"]
    if done.returncode != 0 or not rows:
        return None, f"ncu exit {done.returncode}: {(done.stderr or done.stdout)[-800:]}"
    durations = [float(r["Metric Value"].replace(",", "")) * NCU_UNITS[r["Metric Unit"]] for r in rows]
    per_call = len(durations) // NCU_CALLS
    if per_call == 0 or len(durations) % NCU_CALLS:
        return None, f"ncu profiled {len(durations)} kernels for {NCU_CALLS} calls"
    calls = [sum(durations[i * per_call:(i + 1) * per_call]) for i in range(NCU_CALLS)]
    return statistics.median(calls), f"{per_call} kernel(s) per call: {sorted({r['Kernel Name'][:60] for r in rows})}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("fidelity.json"))
    parser.add_argument("--kernels", default=",".join(KERNELS), help="comma-separated subset")
    parser.add_argument("--ncu", action="store_true", help="also time each call under Nsight Compute")
    parser.add_argument("--ncu-cache", choices=("all", "none"), default="all",
                        help="ncu's --cache-control: caches flushed before each kernel (all, the default) or not")
    parser.add_argument("--ncu-target", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ncu_target:
        return ncu_target(args.ncu_target)
    config = EvalConfig(device="cuda", correctness_rounds=2, timing_sets=5, warmup_runs=5, timing_runs=100,
                        timing_budget_s=2.0, attempt_timeout_s=300, timed_bytes=2 << 30)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ks-bench-", dir="/var/tmp") as tmp:
        os.chmod(tmp, 0o755)  # its problems' references run as their own user, which must read them
        for name in args.kernels.split(","):
            body, axes, dtype, line = KERNELS[name]
            problem = load_problem(write_problem(Path(tmp), name, body, axes, dtype))
            ours = []
            for _ in range(args.repeats):
                result = evaluate(problem, solution(name, line), config)
                if result.status.value != "PASSED":
                    raise SystemExit(f"{name}: {result.status.value}: {result.message}")
                ours.append(result.traces[0].evaluation.performance.latency_ms)
                mode = result.traces[0].evaluation.timing.mode
            reference = do_bench_ms(name)
            median = statistics.median(ours)
            row = {"kernel": name, "timing_mode": mode, "ours_ms": ours, "ours_median_ms": median, "do_bench_ms": reference,
                   "ratio": median / reference, "spread": max(ours) / min(ours)}
            if args.ncu:
                row["ncu_ms"], row["ncu_note"] = ncu_ms(name, args.ncu_cache)
                row["ratio_ncu"] = median / row["ncu_ms"] if row["ncu_ms"] else None
                row["ncu_minus_ours_us"] = (row["ncu_ms"] - median) * 1e3 if row["ncu_ms"] else None
            rows.append(row)
            print(f"{name}: ours {ours} do_bench {reference:.4f} ncu {row.get('ncu_ms')} {row.get('ncu_note', '')}",
                  flush=True)
    report = {"date": datetime.now(timezone.utc).isoformat(), "hardware": torch.cuda.get_device_name(),
              "command": f"python bench/evaluator_fidelity.py --repeats {args.repeats} --kernels {args.kernels}"
                         + (f" --ncu --ncu-cache {args.ncu_cache}" if args.ncu else ""),
              "rows": rows}
    args.out.write_text(json.dumps(report, indent=2))
    print(f"fidelity on {report['hardware']}")
    print(f"{'kernel':16} {'timed':9} {'ours ms':>10} {'do_bench ms':>12} {'ours/db':>8} {'ncu ms':>10} {'ours/ncu':>8} "
          f"{'ncu-ours us':>11} {'max/min':>8}")
    for r in rows:
        ncu = (f"{r['ncu_ms']:>10.4f} {r['ratio_ncu']:>8.3f} {r['ncu_minus_ours_us']:>11.2f}" if r.get("ncu_ms")
               else f"{'-':>10} {'-':>8} {'-':>11}")
        print(f"{r['kernel']:16} {str(r['timing_mode']):9} {r['ours_median_ms']:>10.4f} {r['do_bench_ms']:>12.4f} {r['ratio']:>8.3f} {ncu} "
              f"{r['spread']:>8.3f}")


if __name__ == "__main__":
    main()

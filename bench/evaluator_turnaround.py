"""Turnaround of one attempt: wall time to build, verify and time a 16-workload problem.

    python bench/evaluator_turnaround.py --device cuda --out turnaround.json

Cases: the same elementwise kernel as language `cuda` with an empty build cache (cold: nvcc runs),
again with the cubin cached, as a `pytorch` solution, as `cuda` and as `pytorch` with children
started on demand instead of spares started ahead, and as `cuda_cpp` (a torch extension: cold, then
cached). A cold case gets an empty build cache whatever ran before it; a cached case first runs one
uncounted attempt that fills the shared cache (so `--cases 1` alone measures a hit); the evaluator's own CUDA context
is made before the first case, as the service does at start. On a CPU: `--device cpu --cases 2,6
--workloads 4` (the pytorch cases, small workloads). The
wall time of each phase (build, reference child, candidate child, checks) is recorded. Prints a
table; writes JSON. `--outer-clock on|off` sets the evaluator's outer clock (its cost);
`--gpu-handover on|off` whether output sets reach the checker in GPU memory or through files;
`--replay on|off` whether a `cuda` solution is recorded and replayed (a third child) or timed in process.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from services.evaluator.config import EvalConfig

from services.evaluator.evaluate import evaluate, warm_up
from services.evaluator.spares import ALL_HOMES, SPARE_READY_S, Spares
from shared.hardware import cpu_name
from shared.schema import Solution, load_problem
from shared.store import LocalStore

KERNEL = r"""
extern "C" __global__ void scale(const float* __restrict__ x, const float* __restrict__ w,
                                 float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float r;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(x[i]), "f"(w[i]));
    y[i] = r;
}
"""
LAUNCH = """
def run(x, w, y, *, kernels):
    n = y.numel()
    kernels.scale(x, w, y, n, grid=((n + 255) // 256,), block=(256,))
"""
TORCH = "import torch\n\ndef run(x, w, y):\n    torch.mul(x, w, out=y)\n"
EXTENSION = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void scale(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float r;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(x[i]), "f"(w[i]));
    y[i] = r;
}

void run(torch::Tensor x, torch::Tensor w, torch::Tensor y) {
    int n = y.numel();
    scale<<<(n + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(), n);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run); }
"""


def write_problem(root: Path) -> Path:
    definition = {
        "name": "bench_scale", "op_type": "elementwise", "axes": {"n": {"type": "var"}},
        "inputs": {"x": {"shape": ["n"], "dtype": "float32"}, "w": {"shape": ["n"], "dtype": "float32"}},
        "outputs": {"y": {"shape": ["n"], "dtype": "float32"}},
        "reference": "import torch\n\ndef run(x, w):\n    return x * w\n",
    }
    root.mkdir(parents=True, exist_ok=True)
    (root / "definition.json").write_text(json.dumps(definition))
    sizes = [1 << k for k in range(10, 26)]  # 16 workloads, 4 KiB to 128 MiB per tensor
    (root / "workload.jsonl").write_text("".join(json.dumps(
        {"uuid": f"n{n}", "axes": {"n": n}, "inputs": {"x": {"type": "random"}, "w": {"type": "random"}},
         "tolerance": {"max_atol": 1e-6, "max_rtol": 1e-6}}) + "\n" for n in sizes))
    return root


def solution(language: str) -> Solution:
    sources, entry = {
        "cuda": ([{"path": "launch.py", "content": LAUNCH}, {"path": "scale.cu", "content": KERNEL}], "launch.py::run"),
        "cuda_cpp": ([{"path": "scale.cu", "content": EXTENSION}], "scale.cu::run"),
        "pytorch": ([{"path": "main.py", "content": TORCH}], "main.py::run"),
    }[language]
    return Solution.model_validate({
        "name": f"scale_{language}", "definition": "bench_scale", "author": "bench",
        "spec": {"languages": [language], "target_hardware": ["LOCAL"], "entry_point": entry},
        "sources": sources})


CASES = [  # (case, language, spares started ahead)
    ("cuda, cold build", "cuda", True),
    ("cuda, cached cubin", "cuda", True),
    ("pytorch", "pytorch", True),
    ("cuda, cached, no spares", "cuda", False),
    ("cuda_cpp, cold build", "cuda_cpp", True),
    ("cuda_cpp, cached module", "cuda_cpp", True),
    ("pytorch, no spares", "pytorch", False),
]


def timed_attempt(problem, solution_, config, max_workloads: int | None = None) -> dict:
    """One attempt with the wall time of each phase (from the evaluator's progress messages)."""
    marks: list[tuple[str, float]] = []
    started = time.perf_counter()
    result = evaluate(problem, solution_, config, max_workloads, progress=lambda m: marks.append((m.split()[0], time.perf_counter())))
    ended = time.perf_counter()
    stamps = [t for _, t in marks] + [ended]
    phases = {name: round(stamps[k + 1] - t, 3) for k, (name, t) in enumerate(marks)}
    latencies = {t.workload.uuid: t.evaluation.performance.latency_ms for t in result.traces
                 if t.evaluation.performance}
    clocks = sorted({t.evaluation.timing.clock for t in result.traces if t.evaluation.timing})
    return {"status": result.status.value, "wall_s": round(ended - started, 2), "phases_s": phases,
            "child_phases_s": result.child_phases, "workloads": len(result.traces), "clock": ",".join(c or "?" for c in clocks), "latency_ms": latencies,
            "message": result.message[:2000]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=Path("turnaround.json"))
    parser.add_argument("--cases", help="comma-separated case numbers, 0-based (default: all)")
    parser.add_argument("--workloads", type=int, help="only the first N workloads (the smallest; for a CPU)")
    parser.add_argument("--repeat", type=int, default=1, help="attempts per case (the table shows the median)")
    parser.add_argument("--outer-clock", choices=["on", "off"],
                        help="the evaluator's outer clock (default: on, as in the evaluator)")
    parser.add_argument("--gpu-handover", choices=["on", "off"],
                        help="output sets to the checker in GPU memory (default: on, as in the evaluator)")
    parser.add_argument("--replay", choices=["on", "off"],
                        help="`cuda`: record and replay (default: on, as in the evaluator); off: timed in process")
    args = parser.parse_args()
    cases = [CASES[int(k)] for k in args.cases.split(",")] if args.cases else CASES
    rows = []
    with tempfile.TemporaryDirectory(prefix="ks-bench-", dir="/var/tmp") as tmp:
        os.chmod(tmp, 0o755)  # its problems' references run as their own user, which must read them
        problem = load_problem(write_problem(Path(tmp) / "problem"))
        cache = LocalStore(Path(tmp) / "store")
        spares = Spares(args.device, None)
        if args.device.startswith("cuda"):  # as the evaluator service does once, at start
            warm_up(args.device)
        for case, language, ahead in cases:
            config = EvalConfig(device=args.device, build_cache=cache, spares=spares if ahead else None,
                                outer_clock=args.outer_clock != "off", gpu_handover=args.gpu_handover != "off",
                                replay=args.replay != "off")
            if ahead:  # as in the evaluator service between attempts: spares started and warm
                spares.refill(ALL_HOMES)
                for spare in spares._ready.values():
                    spare.wait_ready(SPARE_READY_S)
            if "cached" in case:  # fill the shared build cache first: cold cases build into stores of their own
                primed = timed_attempt(problem, solution(language), config, args.workloads)
                print(f"{case}: priming attempt {primed['status']} {primed['wall_s']} s (not counted)", flush=True)
            runs = []
            for k in range(args.repeat):
                if "cold" in case:  # an empty build cache for every run of a cold case, whatever ran before
                    config = dataclasses.replace(config, build_cache=LocalStore(Path(tmp) / f"cold-{len(rows)}-{k}"))
                if ahead:
                    for spare in spares._ready.values():
                        spare.wait_ready(SPARE_READY_S)
                runs.append(timed_attempt(problem, solution(language), config, args.workloads))
            runs.sort(key=lambda r: r["wall_s"])
            row = {"case": case, **runs[len(runs) // 2], "wall_s_all": [r["wall_s"] for r in runs]}
            rows.append(row)
            print(f"{case}: {row['status']} {row['wall_s']} s {row['phases_s']} children {row['child_phases_s']}",
                  flush=True)
        spares.close()
    hardware = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU {cpu_name()}"
    report = {"date": datetime.now(timezone.utc).isoformat(), "hardware": hardware,
              "command": f"python bench/evaluator_turnaround.py --device {args.device}"
                         + (f" --cases {args.cases}" if args.cases else "")
                         + (f" --workloads {args.workloads}" if args.workloads else "")
                         + (f" --repeat {args.repeat}" if args.repeat != 1 else "")
                         + (f" --outer-clock {args.outer_clock}" if args.outer_clock else "")
                         + (f" --gpu-handover {args.gpu_handover}" if args.gpu_handover else "")
                         + (f" --replay {args.replay}" if args.replay else ""), "rows": rows}
    args.out.write_text(json.dumps(report, indent=2))
    print(f"turnaround on {hardware}")
    print(f"{'case':26} {'status':8} {'wall s':>7} {'build':>6} {'ref':>6} {'cand':>6} {'record':>6} {'timer':>6} "
          f"{'check':>6} clock")
    for row in rows:
        ph = row["phases_s"]
        print(f"{row['case']:26} {row['status']:8} {row['wall_s']:>7.2f} {ph.get('building', 0):>6.2f} "
              f"{ph.get('reference', 0):>6.2f} {ph.get('candidate', 0):>6.2f} {ph.get('recording', 0):>6.2f} "
              f"{ph.get('timer', 0):>6.2f} {ph.get('checking', 0):>6.2f} "
              f"{row['clock']}")
    first, last = rows[0]["latency_ms"], rows[-1]["latency_ms"]
    print(f"\n{'workload':10} {rows[0]['case'][:14]:>14} {rows[-1]['case'][:14]:>14}")
    for uuid in first:
        print(f"{uuid:10} {first[uuid]:>14.4f} {last.get(uuid, float('nan')):>14.4f}")


if __name__ == "__main__":
    main()

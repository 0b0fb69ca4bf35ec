"""The whole record step of a `cuda` attempt on a CPU machine: the wall time from the evaluator's
"recording" to its "timer" message (the record child's job hand-over, launch.py loaded, two
recordings per workload, its exit, the evaluator's checks), with spares started ahead as the
service keeps them. No GPU: the cubin is built by nvcc (it must be on PATH), the attempt's timing
child then fails to load pycuda, which this bench ignores; what it times ends before that.

    python bench/record_step.py --workloads 16 --repeat 5 --out record_step.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from services.evaluator import evaluate as evaluate_module
from services.evaluator.config import EvalConfig
from services.evaluator.evaluate import evaluate
from services.evaluator.languages.build import Build, resolved_tunables
from services.evaluator.languages.nvcc import CUBIN_FILE, build_cubin
from services.evaluator.spares import ALL_HOMES, SPARE_READY_S, Spares
from shared.hardware import cpu_name
from shared.schema import Solution, load_problem

KERNEL = 'extern "C" __global__ void scale(const float* x, const float* w, float* y, int n) {}\n'
LAUNCH = """
def run(x, w, y, *, kernels):
    n = y.numel()
    kernels.scale(x, w, y, n, grid=((n + 255) // 256,), block=(256,))
"""


def write_problem(root: Path, workloads: int) -> Path:
    definition = {"name": "bench_scale", "axes": {"n": {"type": "var"}},
                  "inputs": {"x": {"shape": ["n"], "dtype": "float32"}, "w": {"shape": ["n"], "dtype": "float32"}},
                  "outputs": {"y": {"shape": ["n"], "dtype": "float32"}},
                  "reference": "import torch\n\ndef run(x, w):\n    return x * w\n"}
    root.mkdir(parents=True)
    (root / "definition.json").write_text(json.dumps(definition))
    (root / "workload.jsonl").write_text("".join(json.dumps(
        {"uuid": f"n{1 << k}", "axes": {"n": 1 << k}, "inputs": {"x": {"type": "random"}, "w": {"type": "random"}},
         "tolerance": {"max_atol": 1e-6, "max_rtol": 1e-6}}) + "\n" for k in range(10, 10 + workloads)))
    return root


def cpu_build(solution: Solution, device: str, target: Path, arch=None, cache=None) -> Build:
    """The `cuda` build on a CPU device, which the evaluator refuses: sources written, nvcc's cubin."""
    target.mkdir(parents=True, exist_ok=True)
    for source in solution.sources:
        (target / source.path).write_text(source.content)
    tunables = resolved_tunables(solution)
    built = build_cubin(solution, "sm_90a", tunables, target.parent / "nvcc")
    (target / CUBIN_FILE).write_bytes(built.cubin)
    return Build(None, "", target, tunables, target / CUBIN_FILE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workloads", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("record_step.json"))
    args = parser.parse_args()
    evaluate_module.build_solution = cpu_build
    solution = Solution.model_validate({
        "name": "scale_cuda", "definition": "bench_scale", "author": "bench",
        "spec": {"languages": ["cuda"], "target_hardware": ["LOCAL"], "entry_point": "launch.py::run"},
        "sources": [{"path": "launch.py", "content": LAUNCH}, {"path": "scale.cu", "content": KERNEL}]})
    walls, children = [], []
    with tempfile.TemporaryDirectory() as tmp:
        problem = load_problem(write_problem(Path(tmp) / "problem", args.workloads))
        spares = Spares("cpu", None)
        config = EvalConfig(device="cpu", correctness_rounds=3, spares=spares)
        for _ in range(args.repeat + 1):  # the first warms the fork server and the pool, not counted
            spares.refill(ALL_HOMES)
            for spare in spares._ready.values():
                spare.wait_ready(SPARE_READY_S)
            marks: dict[str, float] = {}
            result = evaluate(problem, solution, config,
                              progress=lambda m: marks.setdefault(m.split()[0], time.perf_counter()))
            walls.append(marks["timer"] - marks["recording"])
            children.append(result.child_phases.get("record", {}))
        spares.close()
    walls, children = walls[1:], children[1:]
    report = {"date": datetime.now(timezone.utc).isoformat(), "hardware": f"CPU {cpu_name()}",
              "command": f"python bench/record_step.py --workloads {args.workloads} --repeat {args.repeat}",
              "record_step_s": [round(w, 3) for w in walls], "median_s": round(statistics.median(walls), 3),
              "record_child_phases_s": children}
    print(json.dumps(report, indent=2))
    args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

"""False accusations: honest solutions evaluated many times on a loaded machine, verdicts counted.

    python bench/false_positives.py --device cpu --attempts 500 --out fp-cpu.json
    python bench/false_positives.py --device cuda --attempts 200 --jobs 4 --out fp-h200.json

Every honest solution the project has takes turns: the library's seeds that the device runs
(`problems/*/solutions/*_seed.json`: `pytorch` on a CPU; `cuda`, `pytorch`, `triton` and, where
installed, `cute_dsl` on a GPU), each on its problem's first `--max-workloads` workloads, and the
legitimate cases of the reward-hack suite (`tests/hacks/test_legitimate.py`: correct ways to write
y = x * w + b that the guards must leave alone) on its tiny problem. The evaluator runs as the
service runs it: settings from the environment (`Settings.from_env`), children started ahead
(spares), the outer clock on.

While they run, `--load` processes (default: one per core) keep every core busy with arithmetic and
memory traffic, so the attempts meet the jitter of a shared machine; `--gpu-load` adds a process
that keeps the GPU busy with matrix products (a shared GPU). `--jobs N` runs N evaluators at once, each
in a process of its own with its own children (a shared GPU too: N attempts on one device), taking
turns over the same solutions; `--budget-s` starts no attempt after that many seconds, so that a run
with a deadline ends with whole attempts. Counted per solution: attempts, PASSED,
REWARD_HACK, any other status, and workloads the outer clock re-timed. Honest code must never be
REWARD_HACK; every non-PASSED verdict is kept with its message in the JSON. Prints a table; writes JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from services.evaluator.config import EvalConfig  # noqa: E402
from services.evaluator.evaluate import evaluate, scratch_root, warm_up  # noqa: E402
from services.evaluator.languages import entry_for, runs_on  # noqa: E402
from services.evaluator.spares import spares_for  # noqa: E402
from shared.hardware import cpu_name  # noqa: E402
from shared.schema import Solution, load_problem  # noqa: E402
from shared.settings import Settings  # noqa: E402
from shared.store import LocalStore  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Honest:
    name: str
    problem: object
    solution: Solution
    max_workloads: int | None


def library_seeds(device: str, max_workloads: int, only: list[str] | None) -> list[Honest]:
    found = []
    for path in sorted((REPO / "problems").glob("*/solutions/*_seed.json")):
        folder = path.parents[1]
        if only and folder.name not in only:
            continue
        solution = Solution.model_validate_json(path.read_text())
        if not runs_on(solution, device) or entry_for(solution.spec.language).unavailable() is not None:
            continue
        found.append(Honest(f"{folder.name}/{path.stem}", load_problem(folder, with_seeds=False), solution,
                            max_workloads))
    return found


def legitimate_cases(root: Path, device: str) -> list[Honest]:
    """The hack suite's legitimate solutions, on the suite's own tiny problem (CPU-side tensors are
    moved to the device by the evaluator's inputs; the cases are device-agnostic torch, except those
    that hand a tensor to numpy: honest on a CPU only, left out on a GPU)."""
    from tests.evaluator.evalkit import affine_definition, affine_workloads, make_problem, make_solution
    from tests.hacks.test_legitimate import CASES

    problem = make_problem(root, affine_definition(), affine_workloads())
    cases = []
    for case in CASES:
        if case.problem != "affine_float32" or case.config:
            continue  # variants need the suite's own fixtures
        if device != "cpu" and (".numpy(" in case.code or "ctypes.memmove" in case.code):
            continue  # numpy and memmove cannot read GPU memory: the case is written for a CPU
        cases.append(Honest(f"legitimate/{case.id}", problem, make_solution(case.code, **case.solution), None))
    return cases


def _burn(stop: multiprocessing.Event, seed: int) -> None:
    """One core busy: arithmetic on a buffer larger than the caches (memory traffic too)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    data = rng.random(4 << 20)  # 32 MiB
    while not stop.is_set():
        data = np.sqrt(data * 1.0001 + 0.5)


def _gpu_burn(stop: multiprocessing.Event) -> None:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    while not stop.is_set():
        for _ in range(20):
            a = torch.nn.functional.normalize(a @ a, dim=1)
        torch.cuda.synchronize()


def start_load(processes: int, gpu: bool) -> tuple[multiprocessing.Event, list]:
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    workers = [ctx.Process(target=_burn, args=(stop, k), daemon=True) for k in range(processes)]
    if gpu:
        workers.append(ctx.Process(target=_gpu_burn, args=(stop,), daemon=True))
    for w in workers:
        w.start()
    return stop, workers


def stop_load(stop, workers) -> None:
    stop.set()
    for w in workers:
        w.join(10)
        if w.is_alive():
            w.kill()


def one_attempt(honest: Honest, config: EvalConfig) -> dict:
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    result = evaluate(honest.problem, honest.solution, config, honest.max_workloads)
    timings = [t.evaluation.timing for t in result.traces if t.evaluation.timing is not None]
    retimed = sum(1 for t in timings if (getattr(t, "outer_retimes", None) or 0) > 0)
    charged = sum(1 for t in timings if getattr(t, "outer_charged_ms", None) is not None)
    statuses = Counter(t.evaluation.status.value for t in result.traces)
    modes = Counter(t.mode or "?" for t in timings)  # "replay" or "in_process" (a `cuda` seed's reason on its trace)
    return {"solution": honest.name, "status": result.status.value, "wall_s": round(time.perf_counter() - started, 2),
            "load_1min": round(load_before, 2), "workloads": len(result.traces), "workload_statuses": dict(statuses),
            "retimed_workloads": retimed, "charged_workloads": charged, "timing_modes": dict(modes),
            "message": result.message[:1500] if result.status.value != "PASSED" else ""}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--attempts", type=int, default=500, help="attempts in all, solutions taking turns")
    parser.add_argument("--load", type=int, default=os.cpu_count(), help="CPU load processes (0: none)")
    parser.add_argument("--gpu-load", action="store_true", help="also keep the GPU busy (matrix products)")
    parser.add_argument("--max-workloads", type=int, default=2, help="library seeds: the first N workloads")
    parser.add_argument("--problems", help="comma-separated library problems (default: all)")
    parser.add_argument("--no-library", action="store_true", help="only the hack suite's legitimate cases")
    parser.add_argument("--no-legitimate", action="store_true", help="only the library's seeds")
    parser.add_argument("--jobs", type=int, default=1, help="evaluators at once, one process each")
    parser.add_argument("--budget-s", type=float, help="start no attempt after this many seconds")
    parser.add_argument("--shard", help=argparse.SUPPRESS)  # "J/N": one of --jobs' processes
    parser.add_argument("--out", type=Path, default=Path("false_positives.json"))
    args = parser.parse_args()
    if args.jobs < 1 or args.attempts < 1:
        raise SystemExit("--jobs and --attempts must be at least 1")
    if args.jobs > 1 and args.shard is None:
        return _run_jobs(args)

    settings = Settings.from_env(device=args.device)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="ks-bench-", dir="/var/tmp") as tmp:
        os.chmod(tmp, 0o755)  # its problems' references run as their own user, which must read them
        honest: list[Honest] = []
        if not args.no_library:
            honest += library_seeds(args.device, args.max_workloads,
                                    args.problems.split(",") if args.problems else None)
        if not args.no_legitimate:
            honest += legitimate_cases(Path(tmp) / "legit", args.device)
        if not honest:
            raise SystemExit("no honest solution selected")
        config = EvalConfig.from_settings(settings, args.device, LocalStore(Path(tmp) / "store"))
        config = dataclasses.replace(config, spares=spares_for(args.device, scratch_root(config), config.fork_server))
        if args.device.startswith("cuda"):
            warm_up(args.device)
        hardware = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU {cpu_name()}"
        stop, workers = start_load(args.load, args.gpu_load)
        began = time.perf_counter()
        shard, shards = (int(n) for n in args.shard.split("/")) if args.shard else (0, 1)
        try:
            for k in range(shard, args.attempts, shards):  # one shard's turns: attempts k = shard mod shards
                if args.budget_s is not None and time.perf_counter() - began > args.budget_s:
                    print(f"budget of {args.budget_s:.0f} s spent: no more attempts", flush=True)
                    break
                row = one_attempt(honest[k % len(honest)], config)
                rows.append({**row, "job": shard})
                flag = "" if row["status"] == "PASSED" else f"  <-- {row['message'][:200]}"
                print(f"[{k + 1}/{args.attempts}] {row['solution']}: {row['status']} {row['wall_s']} s "
                      f"load {row['load_1min']} retimed {row['retimed_workloads']}{flag}", flush=True)
                _write(args, hardware, rows, time.perf_counter() - began)  # a run cut short keeps its counts
        finally:
            stop_load(stop, workers)
    if args.shard is None:
        _print_table(hardware, args, _summary(rows), rows)


def _run_jobs(args) -> None:
    """`--jobs N`: N processes of this bench, each one shard of the attempts and no load of its own,
    under one load made here; their rows merged into one report as they come."""
    import subprocess

    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp) / f"job{j}.json" for j in range(args.jobs)]
        passed = _drop_values(sys.argv[1:], ("--jobs", "--out", "--load"))
        stop, workers = start_load(args.load, args.gpu_load)
        began = time.perf_counter()
        try:
            jobs = [subprocess.Popen([sys.executable, __file__, *passed, "--load", "0", "--shard",
                                      f"{j}/{args.jobs}", "--out", str(out)]) for j, out in enumerate(outs)]
            while any(job.poll() is None for job in jobs):
                time.sleep(5)
                _write(args, *_read_shards(outs), time.perf_counter() - began)
        finally:
            stop_load(stop, workers)
        hardware, rows = _read_shards(outs)
        failed = [j for j, job in enumerate(jobs) if job.returncode != 0]
    _write(args, hardware, rows, time.perf_counter() - began)
    _print_table(hardware, args, _summary(rows), rows)
    if failed:
        raise SystemExit(f"job(s) {failed} exited with an error; their attempts so far are counted")


def _drop_values(argv: list[str], names: tuple[str, ...]) -> list[str]:
    """argv without the options `names` and their values (`--name value` or `--name=value`)."""
    kept, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in names:
            skip = True
        elif not a.startswith(tuple(f"{n}=" for n in names)):
            kept.append(a)
    return kept


def _read_shards(outs: list[Path]) -> tuple[str, list[dict]]:
    """The hardware the shards name and their rows so far (a shard not written yet adds none)."""
    hardware, rows = "unknown", []
    for out in outs:
        try:
            report = json.loads(out.read_text())
            hardware, rows = report["hardware"], rows + report["attempts"]
        except (OSError, ValueError, KeyError):  # not written yet
            continue
    return hardware, rows


def _write(args, hardware: str, rows: list[dict], elapsed_s: float) -> None:
    report = {"date": datetime.now(timezone.utc).isoformat(), "hardware": hardware, "cores": os.cpu_count(),
              "command": " ".join(["python", "bench/false_positives.py", *sys.argv[1:]]),
              "load_processes": args.load, "gpu_load": args.gpu_load, "jobs": args.jobs,
              "elapsed_s": round(elapsed_s, 1),
              "summary": _summary(rows), "attempts": rows}
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=2))
    tmp.replace(args.out)


def _summary(rows: list[dict]) -> dict:
    statuses = Counter(r["status"] for r in rows)
    workloads = sum(r["workloads"] for r in rows)
    return {"attempts": len(rows), "statuses": dict(statuses), "reward_hack": statuses.get("REWARD_HACK", 0),
            "not_passed": len(rows) - statuses.get("PASSED", 0), "workloads": workloads,
            "retimed_workloads": sum(r["retimed_workloads"] for r in rows),
            "charged_workloads": sum(r["charged_workloads"] for r in rows),
            "retime_rate": round(sum(r["retimed_workloads"] for r in rows) / workloads, 4) if workloads else None,
            "median_load_1min": sorted(r["load_1min"] for r in rows)[len(rows) // 2] if rows else None}


def _print_table(hardware: str, args, summary: dict, rows: list[dict]) -> None:
    per: dict[str, Counter] = {}
    for r in rows:
        c = per.setdefault(r["solution"], Counter())
        c["attempts"] += 1
        c[r["status"]] += 1
        c["retimed"] += r["retimed_workloads"]
    print(f"\nfalse positives on {hardware}, load {args.load} processes" + (" + GPU" if args.gpu_load else "")
          + (f", {args.jobs} evaluators at once" if args.jobs > 1 else ""))
    print(f"{'solution':52} {'runs':>5} {'PASSED':>7} {'HACK':>5} {'other':>6} {'retimed':>8}")
    for name, c in per.items():
        other = c["attempts"] - c["PASSED"] - c["REWARD_HACK"]
        print(f"{name[:52]:52} {c['attempts']:>5} {c['PASSED']:>7} {c['REWARD_HACK']:>5} {other:>6} {c['retimed']:>8}")
    print(f"{'total':52} {summary['attempts']:>5} {summary['statuses'].get('PASSED', 0):>7} "
          f"{summary['reward_hack']:>5} {summary['not_passed'] - summary['reward_hack']:>6} "
          f"{summary['retimed_workloads']:>8}")
    print(f"re-time rate {summary['retime_rate']} of {summary['workloads']} workloads; "
          f"median 1-min load {summary['median_load_1min']}")


if __name__ == "__main__":
    main()

"""The tuner's successive halving against running every candidate on every workload, on synthetic
problems with a simulated evaluator: what each spends to find the best variant, and how good what it
finds is.

    python bench/tuner_halving.py --out docs/results/2026-12-03-tuner-halving.json

A synthetic problem: `n` workloads whose sizes grow geometrically, `m` candidates (tunable
combinations). A candidate's true latency on a workload is the workload's base time times a
penalty that depends on how far the candidate's block size is from the workload's best one (which
grows with the size: small shapes want small blocks) plus a per-candidate quality draw; each
measurement multiplies it by log-normal noise (`--noise`, 3% by default). Both strategies read only
measurements, as the tuner does:

- exhaustive: every candidate on every workload; the winner has the best geometric mean.
- halving: `services/worker/halving.next_step` driven to the end, with the recorded attempts as
  its only state (what the writer does); the winner is the best finalist.

Reported per (m, n), over `--problems` random problems: attempts, workload runs, modelled GPU
seconds (`--attempt-s` per attempt for the build and the children, `--workload-s` per workload run:
an assumption, not a measurement; the evaluator's own figures are in docs/results/), how often the
true best was found, the winner's true geometric mean over the true best's (1.000 = the best), and
the same for the per-shape dispatch built from full-set results: each workload to the fastest of
the candidates measured on every workload (all of them for exhaustive, the finalists for halving),
over the true per-workload optimum.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.worker.halving import ETA, Measured, next_step  # noqa: E402
from shared.schema import Solution  # noqa: E402

SHAPES = [(27, 9), (27, 27), (81, 27), (6, 6), (9, 7)]


def candidates(m: int) -> list[Solution]:
    return [Solution.model_validate({
        "name": f"variant[{i}]", "definition": "synthetic", "author": "bench",
        "spec": {"languages": ["pytorch"], "target_hardware": ["CPU"], "entry_point": "main.py::run",
                 "tunables": {"I": list(range(m))}, "tunable_values": {"I": i}},
        "sources": [{"path": "main.py", "content": "def run(x, out):\n    out.copy_(x)\n"}]}) for i in range(m)]


def true_latencies(m: int, n: int, rng: random.Random) -> list[list[float]]:
    """latency[c][w]: base time x (1 + 0.15 |log2 block - log2 best block(w)|) x quality(c)."""
    blocks = [2 ** (4 + (c % 6)) for c in range(m)]  # 16 .. 512, repeated across the other tunables
    quality = [math.exp(rng.gauss(0.0, 0.08)) for _ in range(m)]
    rows = []
    for c in range(m):
        row = []
        for w in range(n):
            base = 0.01 * 2 ** (w * 10 / max(1, n - 1))  # 10 us .. 10 ms
            best_block = 2 ** (4 + 5 * w / max(1, n - 1))
            row.append(base * (1 + 0.15 * abs(math.log2(blocks[c] / best_block))) * quality[c])
        rows.append(row)
    return rows


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


class Simulated:
    def __init__(self, latency: list[list[float]], noise: float, rng: random.Random) -> None:
        self.latency, self.noise, self.rng = latency, noise, rng
        self.records: list[Measured] = []
        self.attempts = self.workload_runs = 0

    def measure(self, c: int, w: int) -> float:
        return self.latency[c][w] * math.exp(self.rng.gauss(0.0, self.noise))

    def run(self, c: int, hash_: str, workloads: list[str]) -> Measured:
        self.attempts += 1
        self.workload_runs += len(workloads)
        record = Measured(f"a{len(self.records)}", hash_, frozenset(workloads), True, True,
                          {u: self.measure(c, int(u[1:])) for u in workloads})
        self.records.append(record)
        return record


def exhaustive(latency, noise, rng) -> tuple[Simulated, int, list[int]]:
    m, n = len(latency), len(latency[0])
    sim = Simulated(latency, noise, rng)
    uuids = [f"w{i}" for i in range(n)]
    measured = [sim.run(c, str(c), uuids).latency_ms for c in range(m)]
    winner = min(range(m), key=lambda c: (geomean(measured[c].values()), c))
    return sim, winner, _per_shape(measured, list(range(m)), uuids)


def halving(latency, noise, rng, eta: int) -> tuple[Simulated, int, list[int]]:
    m, n = len(latency), len(latency[0])
    sim = Simulated(latency, noise, rng)
    pool = candidates(m)
    index = {c.content_hash(): i for i, c in enumerate(pool)}
    uuids = [f"w{i}" for i in range(n)]
    while True:
        step = next_step(pool, uuids, sim.records, eta)
        if step is None:  # one rung: nothing to halve, everything on everything
            return exhaustive(latency, noise, rng)
        if step.candidate is None:
            break
        c = index[step.candidate.content_hash()]
        sim.run(c, step.candidate.content_hash(), list(step.workloads or uuids))
    finalists = [index[f.content_hash()] for f in step.finalists]
    full = {index[r.solution_hash]: r.latency_ms for r in sim.records if len(r.workloads) == n}
    return sim, finalists[0], _per_shape(full, finalists, uuids)


def _per_shape(measured, among: list[int], uuids: list[str]) -> list[int]:
    return [min(among, key=lambda c: (measured[c][u], c)) for u in uuids]


def trial(m: int, n: int, seed: int, args) -> dict:
    rng = random.Random(seed)
    latency = true_latencies(m, n, rng)
    truth = [geomean(row) for row in latency]
    best = min(range(m), key=lambda c: truth[c])
    per_shape_best = geomean(min(latency[c][w] for c in range(m)) for w in range(n))
    out = {}
    for name, run in (("exhaustive", lambda r: exhaustive(latency, args.noise, r)),
                      ("halving", lambda r: halving(latency, args.noise, r, args.eta))):
        sim, winner, shapes = run(random.Random(seed * 7919 + 1))
        out[name] = {
            "attempts": sim.attempts, "workload_runs": sim.workload_runs,
            "gpu_s": sim.attempts * args.attempt_s + sim.workload_runs * args.workload_s,
            "found_best": winner == best, "regret": truth[winner] / truth[best],
            "dispatch_regret": geomean(latency[c][w] for w, c in enumerate(shapes)) / per_shape_best,
        }
    return out


def summarize(trials: list[dict], name: str) -> dict:
    rows = [t[name] for t in trials]
    mean = lambda key: sum(float(r[key]) for r in rows) / len(rows)  # noqa: E731
    return {"attempts": mean("attempts"), "workload_runs": mean("workload_runs"), "gpu_s": mean("gpu_s"),
            "found_best": mean("found_best"), "regret": mean("regret"), "worst_regret": max(r["regret"] for r in rows),
            "dispatch_regret": mean("dispatch_regret")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=50, help="random problems per (m, n)")
    parser.add_argument("--eta", type=int, default=ETA)
    parser.add_argument("--noise", type=float, default=0.03, help="log-normal sigma of one measurement")
    parser.add_argument("--attempt-s", type=float, default=1.0, help="modelled seconds per attempt (build, children)")
    parser.add_argument("--workload-s", type=float, default=1.0, help="modelled seconds per workload run")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    started = time.perf_counter()
    results = []
    print(f"{'m x n':>8} {'strategy':>10} {'attempts':>9} {'wl runs':>8} {'GPU-s':>8} {'found best':>10} "
          f"{'regret':>7} {'worst':>7} {'dispatch':>8}")
    for m, n in SHAPES:
        trials = [trial(m, n, seed, args) for seed in range(args.problems)]
        row = {"candidates": m, "workloads": n}
        for name in ("exhaustive", "halving"):
            s = row[name] = summarize(trials, name)
            print(f"{f'{m} x {n}':>8} {name:>10} {s['attempts']:9.1f} {s['workload_runs']:8.1f} {s['gpu_s']:8.1f} "
                  f"{s['found_best']:10.0%} {s['regret']:7.3f} {s['worst_regret']:7.3f} {s['dispatch_regret']:8.3f}")
        row["gpu_s_saved"] = 1 - row["halving"]["gpu_s"] / row["exhaustive"]["gpu_s"]
        print(f"{'':>8} {'saved':>10} {'':>9} {'':>8} {row['gpu_s_saved']:8.0%}")
        results.append(row)
    report = {"bench": "tuner_halving", "problems": args.problems, "eta": args.eta, "noise": args.noise,
              "attempt_s": args.attempt_s, "workload_s": args.workload_s, "results": results,
              "wall_s": round(time.perf_counter() - started, 2)}
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()

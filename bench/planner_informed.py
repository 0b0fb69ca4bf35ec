"""What knowing a problem's hidden parameters is worth to the default policy (a reference, like the
simulator's oracles: no policy can run it).

    python bench/planner_informed.py --first-seed 100 --seeds 10 --out informed.json

The simulator's problems and outcomes (`planner_sim.py`, measured SOL), the default policy's own
index (`headroom_ucb`) with no exploration bonus and no prior, but with each problem's mean gain
replaced by the true expected share of the headroom 1 − S its next attempt closes:
(1 − fail rate) x progress rate x 0.3 (the mean step) x (ceiling − S) / (1 − S). Each variant knows
some of the three hidden parameters and takes the others at their means over the simulator's
distributions (progress 0.167, fail rate 0.325, ceiling 0.765). Reported: the median share of the
budget at which the variant first had round-robin's final geomean, as `planner_sim.py` reports it.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import planner_sim as sim  # noqa: E402
from services.planner.policy import HEADROOM_UCB, ROUND_ROBIN, PolicyConfig, ProblemStats  # noqa: E402

MEANS = {"progress": 0.167, "fail_rate": 0.325, "ceiling": 0.765}
VARIANTS = (("progress", "fail_rate", "ceiling"), ("fail_rate", "ceiling"), ("ceiling",), ("progress",),
            ("fail_rate",), ())


class InformedProblem(sim.SimProblem):
    known: tuple[str, ...] = ()

    def stats(self, problem_id: int, mode: str) -> ProblemStats:
        stats = super().stats(problem_id, mode)
        value = {k: getattr(self.hidden, k) if k in self.known else MEANS[k] for k in MEANS}
        best = self.best if self.best is not None else 0.5
        share = (1 - value["fail_rate"]) * value["progress"] * 0.3 * max(0.0, value["ceiling"] - best) / (1 - best)
        attempts = max(stats.recent_attempts, 1)
        return replace(stats, recent_attempts=attempts, recent_gain=share * attempts)


def measure(seed: int, budget_n: float, known: tuple[str, ...]) -> dict:
    config = PolicyConfig()
    informed = replace(config, exploration=0.0, prior_attempts=1e-9)
    problems = sim.draw_problems(random.Random(seed), 100)
    budget = budget_n * sum(sim.cost_of(h, config) for h in problems)
    target = sim.simulate(ROUND_ROBIN, problems, budget, seed, "sol", 8, 4, config).geomean
    original, InformedProblem.known = sim.SimProblem, known
    sim.SimProblem = InformedProblem
    try:
        run = sim.simulate(HEADROOM_UCB, problems, budget, seed, "sol", 8, 4, informed)
    finally:
        sim.SimProblem = original
    return {"seed": seed, "geomean": run.geomean, "round_robin": target, "reach": sim.reach(run, target, budget)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=100)
    parser.add_argument("--budgets", type=lambda text: [float(x) for x in text.split(",")], default=[20.0, 50.0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    report = {"args": {k: str(v) for k, v in vars(args).items()}, "variants": {}}
    for known in VARIANTS:
        name = ",".join(known) or "nothing"
        for n in args.budgets:
            rows = [measure(seed, n, known) for seed in range(args.first_seed, args.first_seed + args.seeds)]
            median = statistics.median(math.inf if r["reach"] is None else r["reach"] for r in rows)
            report["variants"][f"{name}/{n:g}"] = {"known": list(known), "attempts_per_problem": n, "seeds": rows,
                                                   "reach_median": None if math.isinf(median) else median}
            print(f"knows {name:26} N={n:<4g} reaches RR at {median:.2f}  geomean "
                  f"{statistics.fmean(r['geomean'] for r in rows):.3f}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

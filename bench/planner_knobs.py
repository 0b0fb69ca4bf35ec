"""Round-robin against the default policy with some of its knobs changed: the quick loop for tuning.

    python bench/planner_knobs.py '{"exploration": 5.0}' --first-seed 0 --seeds 8

Per mode (measured SOL, speedup only) and budget (N = 20, 50), the median share of the budget at
which `headroom_ucb` with the `PolicyConfig` overrides first had round-robin's final geomean (the
mean in brackets, a seed where it never did counting 1.2), and how much higher its final geomean
is (mean over seeds). Round-robin and the budget use the default config. Two worker processes.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from dataclasses import replace
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import planner_sim as sim  # noqa: E402
from services.planner.policy import HEADROOM_UCB, ROUND_ROBIN, PolicyConfig  # noqa: E402

MODES = ("sol", "speedup")
BUDGETS = (20.0, 50.0)


def one(job: tuple[int, str, float, dict]) -> tuple[str, float, float | None, float]:
    seed, mode, n, overrides = job
    config = PolicyConfig()
    problems = sim.draw_problems(random.Random(seed), 100)
    budget = n * sum(sim.cost_of(h, config) for h in problems)
    rr = sim.simulate(ROUND_ROBIN, problems, budget, seed, mode, 8, 4, config)
    ours = sim.simulate(HEADROOM_UCB, problems, budget, seed, mode, 8, 4, replace(config, **overrides))
    return mode, n, sim.reach(ours, rr.geomean, budget), ours.geomean / rr.geomean - 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="?", default="{}", help="PolicyConfig fields as JSON")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=8)
    args = parser.parse_args(argv)
    overrides = json.loads(args.overrides)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    with Pool(2) as pool:
        out = pool.map(one, [(s, m, n, overrides) for m in MODES for n in BUDGETS for s in seeds])
    cells = []
    for mode in MODES:
        for n in BUDGETS:
            reach = [r for m, b, r, _ in out if m == mode and b == n]
            better = statistics.fmean(g for m, b, _, g in out if m == mode and b == n)
            median = statistics.median(math.inf if r is None else r for r in reach)
            mean = statistics.fmean(1.2 if r is None else r for r in reach)
            cells.append(f"{mode}/{n:g}: {median:.3f} ({mean:.3f}) {100 * better:+.1f}%")
    print(json.dumps(overrides), f"seeds {seeds[0]}-{seeds[-1]}:", "  ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The built-in tuner on the shipped seeds: a campaign with no LLM, then each problem's seed and the
best solution the campaign found, evaluated again side by side.

    python bench/tuner_run.py --device cpu --duration 60 --out tuner-run.json
    python bench/tuner_run.py --device cuda --duration 600 --out tuner-run.json   # on a GPU

Runs `kernelswarm up --device DEVICE --duration N` in a fresh home (no OPENAI_API_KEY: the writers
are the tuner: seeds first, then successive halving over their tunables). Then, for every problem
whose best PASSED attempt is not the seed as shipped, evaluates both again, alternating, `--repeats`
times each (`services.evaluator.evaluate`, the campaign's settings), so the before/after comparison
is made on the same machine at the same time and not read from one noisy campaign measurement.
Per problem: the seed's and the best's median of per-workload latencies over the repeats (geomean
over workloads), the ratio, and the best's tunables. Prints a table; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def campaign(home: Path, device: str, duration: int, problems_dir: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KERNELSWARM_", "OPENAI_"))}
    env |= {"KERNELSWARM_HOME": str(home), "KERNELSWARM_PROBLEMS_DIR": str(problems_dir)}
    from kernelswarm.launcher import free_port

    done = subprocess.run([sys.executable, "-m", "kernelswarm.cli", "up", "--device", device, "--duration",
                           str(duration), "--port", str(free_port())], env=env, cwd=REPO, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise SystemExit(f"`up` failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return done.stderr


def pairs(home: Path) -> list[tuple]:
    """(problem, seed Solution, best Solution) where the best PASSED attempt is not the shipped seed."""
    from sqlalchemy import select

    from services.worker.tuner import written_out
    from shared.db import AttemptRow, CampaignProblemRow, Database, ProblemRow
    from shared.repository import get_solution
    from shared.schema import load_problem
    from shared.settings import Settings
    from shared.store import open_store

    settings = Settings(home=home)
    db, store = Database(settings.db_url), open_store(settings)
    found = []
    try:
        with db.session() as session:
            rows = session.execute(
                select(ProblemRow.name, AttemptRow.solution_hash)
                .join(CampaignProblemRow, CampaignProblemRow.problem_id == ProblemRow.id)
                .join(AttemptRow, AttemptRow.id == CampaignProblemRow.best_attempt_id)
                .where(AttemptRow.status == "PASSED")).all()
        for name, digest in rows:
            problem = load_problem(REPO / "problems" / name)
            best = get_solution(store, digest)
            seeds = [s for s in written_out(problem.seeds) if s.spec.language == best.spec.language]
            same = [s for s in seeds if s.sources == best.sources]
            seed = same[0] if same else (seeds[0] if seeds else None)
            if seed is not None and (seed.spec.tunable_values != best.spec.tunable_values
                                     or seed.sources != best.sources):
                found.append((problem, seed, best))
    finally:
        db.dispose()
    return found


def per_workload_ms(problem, solution, config) -> dict[str, float] | None:
    from services.evaluator.evaluate import evaluate

    result = evaluate(problem, solution, config)
    if result.status.value != "PASSED":
        return None
    return {t.workload.uuid: t.evaluation.performance.latency_ms for t in result.traces}


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--duration", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("tuner-run.json"))
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from services.evaluator.config import EvalConfig
    from shared.settings import Settings

    rows = []
    with tempfile.TemporaryDirectory(prefix="ks-tuner-run-") as folder:
        home = Path(folder) / "home"
        progress = campaign(home, args.device, args.duration, REPO / "problems")
        config = EvalConfig.from_settings(Settings(home=home), args.device, None)
        found = pairs(home)
        print(f"campaign done: {len(found)} problems whose best is not the shipped seed", file=sys.stderr, flush=True)

        def write() -> None:  # after every problem: a run cut off keeps its rows
            args.out.write_text(json.dumps({
                "date": datetime.now(timezone.utc).isoformat(), "device": args.device,
                "command": f"python bench/tuner_run.py --device {args.device} --duration {args.duration} "
                           f"--repeats {args.repeats}", "campaign_progress_tail": progress[-2000:],
                "rows": rows}, indent=2))

        write()
        for problem, seed, best in found:
            print(f"re-evaluating {problem.name}: seed and best, {args.repeats} times each", file=sys.stderr,
                  flush=True)
            runs = {"seed": [], "best": []}
            for _ in range(args.repeats):
                for label, solution in (("seed", seed), ("best", best)):
                    runs[label].append(per_workload_ms(problem, solution, config))
            if any(r is None for rs in runs.values() for r in rs):
                rows.append({"problem": problem.name, "error": "an evaluation did not pass"})
                write()
                continue
            uuids = list(runs["seed"][0])
            medians = {label: {u: statistics.median(r[u] for r in rs) for u in uuids} for label, rs in runs.items()}
            seed_ms, best_ms = geomean(medians["seed"].values()), geomean(medians["best"].values())
            rows.append({"problem": problem.name, "language": best.spec.language.value,
                         "seed_tunables": dict(seed.spec.tunable_values), "best_tunables": dict(best.spec.tunable_values),
                         "seed_geomean_ms": seed_ms, "best_geomean_ms": best_ms, "best_over_seed": best_ms / seed_ms,
                         "per_workload_ms": medians, "runs": runs})
            write()
    print(f"{'problem':34} {'seed ms':>10} {'best ms':>10} {'best/seed':>9}  best tunables")
    for r in rows:
        if "error" in r:
            print(f"{r['problem']:34} {r['error']}")
            continue
        print(f"{r['problem']:34} {r['seed_geomean_ms']:>10.4f} {r['best_geomean_ms']:>10.4f} "
              f"{r['best_over_seed']:>9.3f}  {r['best_tunables']}")
    if not rows:
        print("no problem's best differs from its seed: nothing to compare")


if __name__ == "__main__":
    main()

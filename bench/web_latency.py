"""Web latency at scale: p95 of the leaderboard and problem pages with 1,000 problems and 100,000
attempts in SQLite (goal: under 150 ms).

    python bench/web_latency.py --out web-latency.json

Seeds a fresh SQLite DB the way the services write it (problems cut from problems/ with their real
definitions and workloads, one solution per attempt, SOL figures on every PASSED attempt and a
traces row per workload of every finished attempt), serves the app with werkzeug on a loopback port
in a thread, and times sequential HTTP requests after a warm-up while attempts keep finishing
(`--churn-per-s`, as on a running swarm). The first request of each kind, which fills the app's
leaderboard cache, is reported on its own. The object store holds each problem's best solution and
traces JSONL, the only objects the pages read. Prints a table; writes JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import logging
import math
import multiprocessing
import os
import platform
import random
import statistics
import tempfile
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlalchemy import insert, select
from werkzeug.serving import make_server

from services.web import create_app
from services.web.submission import reference_solution
from shared.db import AttemptRow, CampaignProblemRow, CampaignRow, Database, ProblemRow, SolutionRow, TraceRow
from shared.hardware import cpu_name
from shared.leaderboard import best_order
from shared.schema import load_problem
from shared.settings import Settings
from shared.store import LocalStore

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = ("llama31_8b_rmsnorm", "llama31_8b_swiglu", "llama31_8b_gemm_o_proj")
STATUSES = (("PASSED", 0.6), ("COMPILE_ERROR", 0.15), ("INCORRECT_NUMERICAL", 0.12), ("RUNTIME_ERROR", 0.08),
            ("TIMEOUT", 0.05))
START = datetime(2026, 11, 1)
BATCH = 5000
PAGES = ("leaderboard page /", "problem page /problems/<name>")


def seed(db: Database, store: LocalStore, problems: int, attempts: int, rng: random.Random) -> list[str]:
    """Problems, one campaign, attempts (with a solution and traces rows each) and the best objects."""
    templates = [load_problem(REPO / "problems" / name, with_seeds=False) for name in TEMPLATES]
    names = _seed_problems(db, templates, problems)
    workloads = {i + 1: [w.uuid for w in templates[i % len(templates)].workloads] for i in range(problems)}
    weights = [rng.paretovariate(1.5) for _ in range(problems)]  # a few hot problems, a long tail
    owners = rng.choices(range(1, problems + 1), weights=weights, k=attempts)
    for first in range(0, attempts, BATCH):
        solutions, rows, traces = [], [], []
        for n in range(first, min(first + BATCH, attempts)):
            solution, row, row_traces = _attempt(n, owners[n], workloads[owners[n]], rng)
            solutions.append(solution)
            rows.append(row)
            traces.extend(row_traces)
        with db.session() as session:
            session.execute(insert(SolutionRow), solutions)
            session.execute(insert(AttemptRow), rows)
            session.execute(insert(TraceRow), traces)
    _store_best_objects(db, store, templates)
    return names


def _seed_problems(db: Database, templates: list, count: int) -> list[str]:
    """`count` problems cut from the templates (their definitions and workloads, a new name each)."""
    names, rows = [], []
    for i in range(count):
        template = templates[i % len(templates)]
        definition = template.definition.model_copy(update={"name": f"{template.name}_{i:04d}"})
        names.append(definition.name)
        rows.append({"id": i + 1, "name": definition.name, "op_type": definition.op_type,
                     "description": definition.description, "created_at": START,
                     "definition_json": definition.model_dump_json(exclude_unset=True),
                     "workloads_jsonl": "".join(w.model_dump_json(exclude_unset=True) + "\n"
                                                for w in template.workloads)})
    with db.session() as session:
        session.execute(insert(ProblemRow), rows)
        session.add(CampaignRow(id=1, name="bench", status="RUNNING", device="h200", writers=64, created_at=START))
        session.flush()
        session.execute(insert(CampaignProblemRow), [{"campaign_id": 1, "problem_id": i + 1, "position": i}
                                                      for i in range(count)])
    return names


def _attempt(n: int, problem_id: int, workloads: list[str], rng: random.Random) -> tuple[dict, dict, list[dict]]:
    """The n-th attempt's solution row, attempt row and traces rows, 25 s after the one before."""
    digest = hashlib.sha256(f"bench-solution-{n}".encode()).hexdigest()
    status = rng.choices([s for s, _ in STATUSES], weights=[w for _, w in STATUSES])[0]
    at = START + timedelta(seconds=n * 25)
    model = rng.choice(("gpt-oss-120b", "qwen3-coder-480b", None))
    solution = {"hash": digest, "problem_id": problem_id, "name": f"s{n}", "author": model or "tuner",
                "language": rng.choice(("cuda", "triton", "pytorch")), "parent_hash": None, "created_at": at}
    passed = status == "PASSED"
    latency = rng.uniform(0.01, 2.0) if passed else None
    row = {"id": str(uuid.UUID(int=rng.getrandbits(128))), "problem_id": problem_id, "solution_hash": digest,
           "campaign_id": 1, "assignment_id": None, "status": status, "device": "h200", "hardware": "NVIDIA H200",
           "worker": f"evaluator@node-{n % 8}", "workloads_total": len(workloads),
           "workloads_passed": len(workloads) if passed else 0, "latency_ms": latency,
           "speedup": rng.uniform(0.5, 6.0) if passed else None,
           "sol_score": rng.uniform(0.3, 0.98) if passed else None,
           "model": model, "tokens": rng.randint(2000, 40000) if model else 0, "gpu_seconds": rng.uniform(1, 30),
           "message": None if passed else f"{status} detail",
           "traces_hash": hashlib.sha256(f"bench-traces-{n}".encode()).hexdigest(),
           "created_at": at - timedelta(seconds=20), "finished_at": at}
    traces = [{"attempt_id": row["id"], "workload_uuid": workload_uuid, "status": status, "latency_ms": latency,
               "reference_latency_ms": latency and latency * 3, "speedup": latency and 3.0,
               "t_sol_ms": latency and latency * 0.5, "t_baseline_ms": latency and latency * 2.5,
               "sol_score": row["sol_score"], "trace_json": "{}"} for workload_uuid in workloads]
    return solution, row, traces


def _store_best_objects(db: Database, store: LocalStore, templates) -> None:
    """Each problem's best solution and traces, stored so that their hashes are the rows' hashes."""
    with db.session() as session:
        problems = session.execute(select(ProblemRow.id, ProblemRow.name)).all()
        for problem in problems:
            best = session.scalars(select(AttemptRow).where(AttemptRow.problem_id == problem.id,
                                                            AttemptRow.status == "PASSED")
                                   .order_by(*best_order()).limit(1)).first()
            if best is None:
                continue
            template = templates[(problem.id - 1) % len(templates)]
            solution = reference_solution(template).model_copy(update={"name": f"{problem.name}_best"})
            solution_hash = store.put(solution.canonical_json())
            traces_hash = store.put(b"".join(json.dumps({"definition": problem.name, "workload": w.uuid,
                                                         "status": "PASSED"}).encode() + b"\n"
                                             for w in template.workloads))
            session.add(SolutionRow(hash=solution_hash, problem_id=problem.id, name=solution.name,
                                    author="bench", language="pytorch"))
            session.flush()
            best.solution_hash, best.traces_hash = solution_hash, traces_hash


class Churn:
    """Attempts finishing while the pages are timed, as on a running swarm: a separate process (as
    the evaluators are) finishes one PASSED attempt, with its solution and a traces row, on a random
    problem every `1 / per_s` seconds."""

    def __init__(self, db_url: str, problems: int, per_s: float) -> None:
        self.per_s = per_s
        self._stop = multiprocessing.Event()
        self._written = multiprocessing.Value("i", 0)
        self._process = multiprocessing.Process(target=_churn, daemon=True,
                                                args=(db_url, problems, per_s, self._stop, self._written))

    @property
    def written(self) -> int:
        return self._written.value

    def __enter__(self) -> Churn:
        if self.per_s > 0:
            self._process.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        if self._process.is_alive():
            self._process.join(timeout=10)


def _churn(db_url: str, problems: int, per_s: float, stop, written) -> None:
    db, rng = Database(db_url, upgrade=False), random.Random(7)
    while not stop.wait(1.0 / per_s):
        problem_id = rng.randint(1, problems)
        digest = hashlib.sha256(f"churn-{written.value}-{time.time_ns()}".encode()).hexdigest()
        now = datetime.now(timezone.utc).replace(tzinfo=None)
        with db.session() as session:
            session.add(SolutionRow(hash=digest, problem_id=problem_id, name=f"churn{written.value}",
                                    author="tuner", language="cuda", created_at=now))
            session.flush()
            attempt_id = str(uuid.uuid4())
            session.add(AttemptRow(id=attempt_id, problem_id=problem_id, solution_hash=digest, campaign_id=1,
                                   status="PASSED", device="h200", hardware="NVIDIA H200", worker="evaluator@churn",
                                   workloads_total=1, workloads_passed=1, latency_ms=rng.uniform(0.01, 2.0),
                                   speedup=rng.uniform(0.5, 6.0), sol_score=rng.uniform(0.3, 0.99),
                                   gpu_seconds=5.0, created_at=now, finished_at=now))
            session.flush()
            session.add(TraceRow(attempt_id=attempt_id, workload_uuid="churn", status="PASSED", latency_ms=1.0,
                                 t_baseline_ms=2.0, trace_json="{}"))
        written.value += 1
    db.dispose()


def measure(port: int, paths: list[str], warmup: int) -> dict:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for path in paths[:warmup]:
        _get(connection, path)
    timings, sizes = [], []
    cpu_started = time.process_time()
    for path in paths:
        started = time.perf_counter()
        size = _get(connection, path)
        timings.append((time.perf_counter() - started) * 1000)
        sizes.append(size)
    cpu_ms = (time.process_time() - cpu_started) * 1000 / len(paths)
    connection.close()
    ordered = sorted(timings)
    return {"requests": len(timings), "p50_ms": _percentile(ordered, 50), "p95_ms": _percentile(ordered, 95),
            "p99_ms": _percentile(ordered, 99), "max_ms": ordered[-1], "mean_ms": statistics.fmean(timings),
            "cpu_ms_per_request": cpu_ms, "mean_kib": statistics.fmean(sizes) / 1024}


def _get_once(port: int, path: str) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        return _get(connection, path)
    finally:
        connection.close()


def _get(connection: http.client.HTTPConnection, path: str) -> int:
    connection.request("GET", path)
    response = connection.getresponse()
    body = response.read()
    if response.status != 200:
        raise RuntimeError(f"GET {path}: HTTP {response.status}: {body[:300]!r}")
    return len(body)


def _percentile(ordered: list[float], q: float) -> float:
    rank = max(0, math.ceil(q / 100 * len(ordered)) - 1)
    return ordered[rank]


def main() -> int:
    args = _parse()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    rng = random.Random(2026)
    with tempfile.TemporaryDirectory(prefix="kernelswarm-web-bench-") as folder:
        home = args.home or Path(folder)
        db = Database(f"sqlite:///{home / 'bench.db'}")
        try:
            started = time.perf_counter()
            names = _load_or_seed(db, LocalStore(home / "store"), args, rng, home)
            seed_s = time.perf_counter() - started
            results, churned = _time_pages(create_app(Settings(home=home), db, LocalStore(home / "store")),
                                           db, names, args, rng)
        finally:
            db.dispose()
    pages_ok = all(results[c]["p95_ms"] < args.goal_ms for c in PAGES)
    _print(results, args, churned, pages_ok)
    report = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
              "cpu": cpu_name(), "cpus": os.cpu_count(), "python": platform.python_version(),
              "problems": args.problems, "attempts": args.attempts, "seed_s": seed_s, "goal_ms": args.goal_ms,
              "churn_per_s": args.churn_per_s, "churn_attempts": churned, "load_average": os.getloadavg(),
              "goal_met": pages_ok, "results": results}
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if pages_ok else 1


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=1000)
    parser.add_argument("--attempts", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=200, help="timed requests per endpoint")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--goal-ms", type=float, default=150.0)
    parser.add_argument("--churn-per-s", type=float, default=5.0,
                        help="attempts finishing per second while timing (0: a still DB)")
    parser.add_argument("--out", type=Path, default=Path("web-latency.json"))
    parser.add_argument("--home", type=Path, default=None,
                        help="keep the seeded DB and store here and reuse them on the next run")
    return parser.parse_args()


def _load_or_seed(db: Database, store: LocalStore, args: argparse.Namespace, rng: random.Random,
                  home: Path) -> list[str]:
    with db.session() as session:
        names = list(session.scalars(select(ProblemRow.name).order_by(ProblemRow.id)))
    if names:
        print(f"reusing the DB in {home} ({len(names)} problems)")
        return names
    started = time.perf_counter()
    names = seed(db, store, args.problems, args.attempts, rng)
    print(f"seeded {args.problems} problems and {args.attempts} attempts in {time.perf_counter() - started:.1f} s")
    return names


def _time_pages(app, db: Database, names: list[str], args: argparse.Namespace,
                rng: random.Random) -> tuple[dict, int]:
    """Each case's first request on its own (it fills the app's caches), then the timed ones."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.socket.getsockname()[1]
    problem_paths = [f"/problems/{rng.choice(names)}" for _ in range(args.requests)]
    cases = {
        PAGES[0]: ["/"] * args.requests,
        PAGES[1]: problem_paths,
        "GET /api/leaderboard": ["/api/leaderboard"] * args.requests,
        "GET /api/problems/<name>": [p.replace("/problems/", "/api/problems/") for p in problem_paths],
    }
    try:
        first_ms = {}
        for case, paths in cases.items():
            started = time.perf_counter()
            _get_once(port, paths[0])
            first_ms[case] = (time.perf_counter() - started) * 1000
        with Churn(db.url, len(names), args.churn_per_s) as churn:
            results = {case: measure(port, paths, args.warmup) | {"first_request_ms": first_ms[case]}
                       for case, paths in cases.items()}
    finally:
        server.shutdown()
        thread.join(timeout=5)
    return results, churn.written


def _print(results: dict, args: argparse.Namespace, churned: int, pages_ok: bool) -> None:
    print(f"{'case':32} {'n':>5} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'max ms':>8} {'first ms':>9} "
          f"{'CPU ms':>7} {'KiB':>7}")
    for case, r in results.items():
        print(f"{case:32} {r['requests']:5d} {r['p50_ms']:8.1f} {r['p95_ms']:8.1f} {r['p99_ms']:8.1f} "
              f"{r['max_ms']:8.1f} {r['first_request_ms']:9.1f} {r['cpu_ms_per_request']:7.1f} {r['mean_kib']:7.1f}")
    print(f"load average (1, 5, 15 min) at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"on {os.cpu_count()} CPUs")
    print(f"attempts that finished while timing: {churned} ({args.churn_per_s:g}/s)")
    print(f"goal p95 < {args.goal_ms:.0f} ms for both pages: {'met' if pages_ok else 'NOT met'}")




if __name__ == "__main__":
    raise SystemExit(main())

"""A seeded swarm for the browser tests and screenshots: real problem definitions, a campaign and a
few hours of attempts that improve over time, with SOL figures, per-workload traces and the
solutions and traces JSONL in the object store, all as the services would write them."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from services.web.submission import reference_solution
from shared.db import AttemptRow, CampaignProblemRow, CampaignRow, Database, TraceRow, utcnow
from shared.repository import put_solution, upsert_problem
from shared.schema import (
    AttemptInfo,
    Correctness,
    Environment,
    Evaluation,
    Performance,
    Problem,
    SolScore,
    Solution,
    Status,
    Timing,
    Trace,
    load_problem,
)
from shared.store import ObjectStore

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO.parent / "shared" / "sol-execbench-sample"
SAMPLE_PROBLEMS = (
    "FlashInfer-Bench/024_rmsnorm_h2048", "FlashInfer-Bench/008_gemm_n4096_k14336", "L1/033_post_norm_residual",
    "L2/027_grouped_query_attention_with_yarn_rope_and_qk_norm", "L1/025_video_latent_gelu_activation",
)
SPAN = timedelta(hours=3)  # the attempts of each problem spread over the last three hours
MODELS = ("gpt-oss-120b", "qwen3-coder-480b", None)  # None: the built-in tuner
FAILURES = {
    "COMPILE_ERROR": "main.cu(41): error: identifier \"__shfl_xor\" is undefined",
    "INCORRECT_NUMERICAL": "workload 3: 1.9% of elements outside atol 0.01 + rtol 0.02 (needed 99.9%)",
    "RUNTIME_ERROR": "RuntimeError: CUDA error: an illegal memory access was encountered",
    "TIMEOUT": "the child exceeded 120 s and was killed",
}


@dataclass(frozen=True)
class Demo:
    campaign_id: int
    problems: list[str]  # those with PASSED attempts
    untouched: str  # a problem without attempts
    failing: str  # a problem whose attempts all failed


def seed_demo(db: Database, store: ObjectStore, attempts_per_problem: int = 36) -> Demo:
    rng = random.Random(7)
    start = utcnow().replace(second=0, microsecond=0) - SPAN
    problems = [load_problem(REPO / "problems" / name) for name in
                ("llama31_8b_rmsnorm", "llama31_8b_swiglu", "llama31_8b_gemm_o_proj")]
    problems += [load_problem(SAMPLE / name, with_seeds=False) for name in SAMPLE_PROBLEMS if (SAMPLE / name).is_dir()]
    with db.session() as session:
        ids = [upsert_problem(session, p).id for p in problems]
        campaign = CampaignRow(name="demo: Llama-3.1-8B and SOL-ExecBench samples", status="RUNNING", device="h200",
                               writers=8, created_at=start)
        session.add(campaign)
        session.flush()
        for position, problem_id in enumerate(ids):
            session.add(CampaignProblemRow(campaign_id=campaign.id, problem_id=problem_id, position=position))
        campaign_id = campaign.id
    *worked, failing, untouched = list(zip(problems, ids))
    for problem, problem_id in worked:
        _attempts(db, store, rng, problem, problem_id, campaign_id, start, attempts_per_problem)
    _attempts(db, store, rng, failing[0], failing[1], campaign_id, start, 6, fail_only=True)
    return Demo(campaign_id, [p.name for p, _ in worked], untouched[0].name, failing[0].name)


def _solution(problem: Problem, n: int, parent: str | None) -> Solution:
    if problem.seeds:
        seed = problem.seed("pytorch")
        return seed.model_copy(update={"name": f"{seed.name}_v{n}", "description": f"variant {n} of {seed.name}"})
    base = reference_solution(problem)
    return base.model_copy(update={"name": f"{problem.name}_v{n}", "description": f"variant {n}"})


@dataclass(frozen=True)
class _Ceilings:
    """Per workload: T_SOL, T_b and the eager reference's latency, in ms."""

    t_sol: list[float]
    t_base: list[float]
    eager: list[float]


def _attempts(db: Database, store: ObjectStore, rng: random.Random, problem: Problem, problem_id: int,
              campaign_id: int, start: datetime, count: int, fail_only: bool = False) -> None:
    t_sol = [0.004 * (1 + i) * rng.uniform(0.8, 1.2) for i in range(len(problem.workloads))]
    t_base = [t * rng.uniform(4.0, 9.0) for t in t_sol]
    ceilings = _Ceilings(t_sol, t_base, [t * rng.uniform(1.1, 1.6) for t in t_base])
    best_hash, progress = None, 0.0
    for n in range(count):
        at = start + (SPAN - timedelta(minutes=2)) * (n + rng.uniform(0, 0.8)) / count
        status = "PASSED" if not fail_only and rng.random() < 0.65 else rng.choice(sorted(FAILURES))
        model = rng.choice(MODELS)
        with db.session() as session:
            digest = put_solution(session, store, problem_id, _solution(problem, n, best_hash), best_hash)
            session.flush()
            attempt = AttemptRow(
                id=f"{problem_id:04d}{n:04d}-5eed-4d00-8000-{rng.getrandbits(48):012x}", problem_id=problem_id,
                solution_hash=digest, campaign_id=campaign_id, status=status, device="h200", hardware="NVIDIA H200",
                worker=f"evaluator@gpu-node-{rng.randint(1, 2)}", model=model, message=FAILURES.get(status),
                tokens=rng.randint(4_000, 40_000) if model else 0, gpu_seconds=rng.uniform(2, 30),
                workloads_total=len(problem.workloads), created_at=at - timedelta(seconds=40), finished_at=at)
            figures = [None] * len(problem.workloads)
            if status == "PASSED":
                progress = min(1.0, progress + rng.uniform(0.0, 0.09))
                figures = _passed(attempt, ceilings, max(0.05, progress - rng.uniform(0.0, 0.25)), rng)
            traces = [_trace(problem, workload, status, f, at, attempt, campaign_id)
                      for workload, f in zip(problem.workloads, figures)]
            for trace, f in zip(traces, figures):
                session.add(TraceRow(
                    attempt_id=attempt.id, workload_uuid=trace.workload.uuid, status=status,
                    latency_ms=f and f[0], reference_latency_ms=f and f[1], speedup=f and f[1] / f[0],
                    t_sol_ms=f and f[2], t_baseline_ms=f and f[3], sol_score=f and f[4],
                    trace_json=trace.model_dump_json(exclude_none=True)))
            jsonl = "".join(t.model_dump_json(exclude_none=True) + "\n" for t in traces)
            attempt.traces_hash = store.put(jsonl.encode())
            session.add(attempt)
        if status == "PASSED":
            best_hash = digest


def _passed(attempt: AttemptRow, ceilings: _Ceilings, quality: float, rng: random.Random) -> list[tuple]:
    """Fill a PASSED attempt's figures; `quality` 0 is the baseline, 1 the hardware limit. Returns per
    workload (latency, eager, T_SOL, T_b, SOL score)."""
    latencies = [b - (b - s) * quality * rng.uniform(0.85, 1.0) for s, b in zip(ceilings.t_sol, ceilings.t_base)]
    scores = [1 / (1 + (k - s) / (b - s)) for k, s, b in zip(latencies, ceilings.t_sol, ceilings.t_base)]
    attempt.workloads_passed = len(latencies)
    attempt.latency_ms = sum(latencies) / len(latencies)
    attempt.speedup = math.exp(sum(math.log(e / k) for e, k in zip(ceilings.eager, latencies)) / len(latencies))
    attempt.sol_score = sum(scores) / len(scores)
    return list(zip(latencies, ceilings.eager, ceilings.t_sol, ceilings.t_base, scores))


def _timing(figures) -> Timing:
    """Interquartile intervals of a few percent around each median, as timed runs on a GPU give."""
    latency, reference = figures[0], figures[1]
    return Timing(median_ms=latency, min_ms=latency * 0.97, max_ms=latency * 1.08, runs=200,
                  q1_ms=latency * 0.99, q3_ms=latency * 1.02, reference_q1_ms=reference * 0.99,
                  reference_q3_ms=reference * 1.03)


def _trace(problem: Problem, workload, status: str, figures, at: datetime, attempt: AttemptRow,
           campaign_id: int) -> Trace:
    passed = figures is not None
    evaluation = Evaluation(
        status=Status(status), environment=Environment(hardware="NVIDIA H200", libs={"torch": "2.13.0"}),
        timestamp=at.isoformat() + "Z", log="" if passed else FAILURES[status],
        correctness=Correctness(max_relative_error=0.004, max_absolute_error=0.002)
        if status in ("PASSED", "INCORRECT_NUMERICAL") else None,
        performance=Performance(latency_ms=figures[0], reference_latency_ms=figures[1],
                                speedup_factor=figures[1] / figures[0]) if passed else None,
        sol=SolScore(t_sol_ms=figures[2], t_baseline_ms=figures[3], score=figures[4], bound="memory",
                     hardware="H200") if passed else None,
        timing=_timing(figures) if passed else None,
    )
    info = AttemptInfo(campaign=str(campaign_id), worker=attempt.worker, model=attempt.model,
                       tokens=attempt.tokens, gpu_seconds=attempt.gpu_seconds)
    return Trace(definition=problem.name, workload=workload, solution=attempt.solution_hash[:12],
                 evaluation=evaluation, attempt=info)

"""A writer's diagnostics (profile, inspect) are no verdicts: whatever counts or ranks outcomes
(the leaderboard, the planner's state, its best, a writer's recent outcomes, the web's history
chart and attempt table, the tuner's rows) leaves them out, while their tokens and GPU seconds
count. The rows are real SQLite rows; one diagnostic row even claims PASSED with the best figures
(a corrupt or forged row): it must rank nowhere."""

from __future__ import annotations

import random
from datetime import timedelta
from pathlib import Path

import pytest

from services.planner.best import update_best
from services.planner.policy import PolicyConfig
from services.planner.state import parent_candidates, problem_stats, recent_attempts
from services.web.problem_data import problem_detail
from services.worker import write
from shared.db import AssignmentRow, AttemptRow, CampaignProblemRow, CampaignRow, utcnow
from shared.leaderboard import leaderboard, status_counts
from shared.repository import INSPECT, PROFILE, create_attempt, get_solution, put_solution, upsert_problem
from shared.runtime import Runtime
from shared.schema import load_problem
from shared.settings import Settings

PROBLEMS = Path(__file__).resolve().parents[2] / "problems"
PROBLEM = load_problem(PROBLEMS / "llama31_8b_rmsnorm")


def add_campaign(runtime: Runtime, problem_id: int) -> int:
    with runtime.db.session() as session:
        campaign = CampaignRow(name="c", device="cpu", status="RUNNING")
        session.add(campaign)
        session.flush()
        session.add(CampaignProblemRow(campaign_id=campaign.id, problem_id=problem_id, position=0))
        return campaign.id


def finished(runtime: Runtime, problem_id: int, campaign_id: int, language: str, minutes: int, *,
             kind: str = "evaluate", status: str, speedup: float | None = None, sol: float | None = None,
             tokens: int = 0, gpu_s: float = 0.0, message: str | None = None) -> str:
    with runtime.db.session() as session:
        digest = put_solution(session, runtime.store, problem_id, PROBLEM.seed(language))
        row = create_attempt(session, problem_id, digest, "cpu", campaign_id=campaign_id, kind=kind)
        row.status, row.speedup, row.sol_score, row.tokens, row.gpu_seconds = status, speedup, sol, tokens, gpu_s
        row.latency_ms = 1.0 / speedup if speedup else None
        row.message, row.finished_at = message, utcnow() + timedelta(minutes=minutes)
        return row.id


@pytest.fixture
def recorded(runtime: Runtime):
    """One evaluation that passed, then three diagnostics after it: a profile, an inspect that
    failed to build, and a row of kind inspect that claims PASSED at 99x (never written by the
    evaluator, which gives diagnostics PROFILED or INSPECTED: here to prove the kind filters)."""
    with runtime.db.session() as session:
        problem_id = upsert_problem(session, PROBLEM).id
    campaign_id = add_campaign(runtime, problem_id)
    evaluation = finished(runtime, problem_id, campaign_id, "pytorch", 1, status="PASSED", speedup=1.5, sol=0.6,
                          tokens=10, gpu_s=2.0)
    finished(runtime, problem_id, campaign_id, "cuda", 2, kind=PROFILE, status="PROFILED", tokens=100, gpu_s=5.0,
             message="one call: 1 launch")
    finished(runtime, problem_id, campaign_id, "cuda", 3, kind=INSPECT, status="COMPILE_ERROR", tokens=1000,
             message="error: undefined")
    forged = finished(runtime, problem_id, campaign_id, "cute_dsl", 4, kind=INSPECT, status="PASSED", speedup=99.0,
                      sol=0.99, tokens=10000, gpu_s=0.5)
    return problem_id, campaign_id, evaluation, forged


def test_the_leaderboard_counts_and_ranks_evaluations_only_but_every_cost(runtime, recorded):
    problem_id, campaign_id, evaluation, _forged = recorded
    with runtime.db.session() as session:
        for scope in (None, campaign_id):
            entry = next(e for e in leaderboard(session, scope).problems if e.name == PROBLEM.name)
            assert (entry.attempts, entry.passed_attempts, entry.status) == (1, 1, "PASSED")
            assert entry.best_attempt_id == evaluation and entry.speedup == 1.5 and entry.sol_score == 0.6
            assert entry.tokens == 11110 and entry.gpu_seconds == pytest.approx(7.5)
        assert status_counts(session, campaign_id) == {problem_id: (("PASSED", 1),)}


def test_only_diagnostics_leave_a_problem_without_attempts_on_the_leaderboard(runtime):
    with runtime.db.session() as session:
        problem_id = upsert_problem(session, PROBLEM).id
    campaign_id = add_campaign(runtime, problem_id)
    finished(runtime, problem_id, campaign_id, "cuda", 1, kind=PROFILE, status="PROFILED", tokens=7, gpu_s=1.0)
    with runtime.db.session() as session:
        entry = next(e for e in leaderboard(session, campaign_id).problems if e.name == PROBLEM.name)
    assert (entry.attempts, entry.status, entry.best_attempt_id) == (0, "NO_ATTEMPTS", None)
    assert entry.tokens == 7 and entry.gpu_seconds == 1.0


def test_the_planner_sees_one_attempt_no_failure_and_every_cost(runtime, recorded):
    problem_id, campaign_id, evaluation, _forged = recorded
    with runtime.db.session() as session:
        stats = problem_stats(session, campaign_id, PolicyConfig())[problem_id]
        assert (stats.attempts, stats.failures, stats.best_speedup, stats.best_sol) == (1, 0, 1.5, 0.6)
        assert stats.stall == 0  # the evaluation's gain is the last: diagnostics after it are no attempts
        assert stats.tokens == 11110 and stats.gpu_s == pytest.approx(7.5)
        assert update_best(session, campaign_id, problem_id) == evaluation
        assert [r.status for r in recent_attempts(session, campaign_id, [problem_id])[problem_id]] == ["PASSED"]
        parents = parent_candidates(session, campaign_id, [problem_id])[problem_id]
        assert [p.solution_hash for p in parents] == [session.get(AttemptRow, evaluation).solution_hash]


def test_the_problem_page_charts_and_lists_evaluations_only(runtime, recorded):
    _problem_id, _campaign_id, evaluation, _forged = recorded
    with runtime.db.session() as session:
        detail = problem_detail(session, PROBLEM.name)
    assert [p.attempt_id for p in detail.history.points] == [evaluation]
    assert [a.id for a in detail.attempts] == [evaluation] and detail.best.id == evaluation


def tuner_proposals(home: Path, before=None, count: int = 3) -> list[str]:
    """The solutions the tuner proposes, in order, on a fresh DB where `before(runtime, problem_id)`
    recorded attempts first; each proposal is given a verdict (PASSED at the rank of its proposal)."""
    runtime = Runtime(Settings(home=home, problems_dir=PROBLEMS, tuner_eta=0))
    try:
        with runtime.db.session() as session:
            problem_id = upsert_problem(session, PROBLEM).id
        campaign_id = add_campaign(runtime, problem_id)
        with runtime.db.session() as session:
            assignment = AssignmentRow(campaign_id=campaign_id, problem_id=problem_id, budget_attempts=count,
                                       status="RUNNING")
            session.add(assignment)
            session.flush()
            assignment_id = assignment.id
        if before is not None:
            before(runtime, problem_id, campaign_id)
        seeds = tuple(s for s in PROBLEM.seeds if s.spec.languages[0].value == "pytorch")
        job = write.Job(assignment_id, campaign_id, problem_id, PROBLEM.name, "cpu", count, 0, "pytorch", None, None,
                        seeds, tuple(w.uuid for w in PROBLEM.workloads))
        rng, proposed = random.Random(1), []
        for rank in range(count):
            attempt_id = write._submit_once(runtime, job, rng)
            with runtime.db.session() as session:
                attempt = session.get(AttemptRow, attempt_id)
                attempt.status, attempt.speedup, attempt.finished_at = "PASSED", 1.0 + rank, utcnow()
                proposed.append(attempt.solution_hash)
        return proposed
    finally:
        runtime.db.dispose()


def test_the_tuner_neither_skips_nor_builds_on_a_diagnosed_solution(tmp_path):
    clean = tuner_proposals(tmp_path / "clean")
    assert len(set(clean)) == 3

    def diagnosed(runtime: Runtime, problem_id: int, campaign_id: int) -> None:
        """The first proposal profiled, and a 99x PASSED row of kind inspect on the third: were
        either read as an evaluation, the tuner would skip the first or walk on from the third."""
        source = Runtime(Settings(home=tmp_path / "clean", problems_dir=PROBLEMS))
        first, third = (get_solution(source.store, h) for h in (clean[0], clean[2]))
        source.db.dispose()
        with runtime.db.session() as session:
            for solution, kind, status, speedup in ((first, PROFILE, "PROFILED", None),
                                                    (third, INSPECT, "PASSED", 99.0)):
                digest = put_solution(session, runtime.store, problem_id, solution)
                row = create_attempt(session, problem_id, digest, "cpu", campaign_id=campaign_id, kind=kind)
                row.status, row.speedup, row.finished_at = status, speedup, utcnow()

    assert tuner_proposals(tmp_path / "diagnosed", diagnosed) == clean

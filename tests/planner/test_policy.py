"""The policies as pure functions: scores, gains, retirement, and who gets the idle writers."""

from __future__ import annotations

import pytest

from services.planner.policy import (
    BASELINE_SCORE, GREEDY_HEADROOM, HEADROOM_UCB, ROUND_ROBIN, CampaignMeans, PolicyConfig, ProblemStats,
    choose, estimated_score, gain, merit, retired, score, sol_speedup_of, ucb_index,
)

CONFIG = PolicyConfig()


def problem(problem_id: int, **fields) -> ProblemStats:
    return ProblemStats(problem_id=problem_id, **{"position": problem_id, **fields})


def worked(problem_id: int, attempts: int, gain_total: float, cost_per_attempt: float = 10.0, **fields) -> ProblemStats:
    """A problem with `attempts` finished attempts that together closed `gain_total` of the headroom."""
    recent = min(attempts, CONFIG.window)
    return problem(problem_id, attempts=attempts, recent_attempts=recent,
                   recent_gain=gain_total * recent / attempts if attempts else 0.0, gain=gain_total,
                   gpu_s=cost_per_attempt * attempts, **fields)


# --- scores and gains ------------------------------------------------------------------------------


def test_the_estimated_score_is_half_at_the_baseline_and_one_at_the_assumed_sol():
    assert estimated_score(1.0) == pytest.approx(0.5)
    assert estimated_score(None) == BASELINE_SCORE
    assert estimated_score(CONFIG.assumed_sol_speedup, cap=1.0) == pytest.approx(1.0)
    assert estimated_score(0.5) < 0.5 < estimated_score(2.0) < estimated_score(4.0)
    assert estimated_score(100.0) == CONFIG.estimate_cap  # an estimate never reaches the retire score


def test_a_measured_sol_score_wins_over_the_estimate():
    assert score(problem(1, best_speedup=2.0, best_sol=0.97)) == 0.97
    assert score(problem(1, best_speedup=2.0)) == pytest.approx(estimated_score(2.0))
    assert score(problem(1)) == BASELINE_SCORE
    assert merit(0.8, 100.0) == 0.8
    assert merit(None, 100.0) < 1.0


@pytest.mark.parametrize(("before", "achieved", "expected"), [
    (None, 0.75, 0.5),  # the first PASSED attempt is measured from the baseline
    (0.5, 0.75, 0.5),
    (0.8, 0.9, 0.5),  # the same share of a smaller headroom
    (0.8, 0.8, 0.0),
    (0.8, 0.7, 0.0),  # worse than the best: no gain
    (None, 0.45, 0.0),
    (1.0, 1.0, 0.0),
])
def test_a_gain_is_the_share_of_the_headroom_closed(before, achieved, expected):
    assert gain(before, achieved) == pytest.approx(expected)


# --- retirement ------------------------------------------------------------------------------------


def test_problems_retire_near_sol_when_stalled_or_exhausted():
    assert retired(problem(1, best_sol=0.95))
    assert not retired(problem(1, best_sol=0.94))
    assert not retired(problem(1, best_speedup=1e6))  # an estimated score never retires
    assert retired(problem(1, stall=CONFIG.stall_attempts))
    assert not retired(problem(1, stall=CONFIG.stall_attempts - 1))
    assert retired(problem(1, exhausted=True))


def test_a_problem_none_passed_retires_after_its_reference_failed_k_times():
    k = CONFIG.invalid_reference_attempts
    assert retired(problem(1, invalid_references=k))
    assert not retired(problem(1, invalid_references=k - 1))
    assert not retired(problem(1, invalid_references=k, best_speedup=1.2))  # some attempt passed it


def test_retired_problems_get_no_writers_and_none_when_all_are():
    problems = [problem(1, best_sol=0.96), problem(2, stall=CONFIG.stall_attempts), problem(3)]
    plan = choose(HEADROOM_UCB, problems, slots=3, per_assignment=4)
    assert set(plan.problem_ids) == {3} and plan.retired == {1, 2}

    plan = choose(HEADROOM_UCB, problems[:2], slots=3, per_assignment=4)
    assert plan.problem_ids == () and plan.retired == {1, 2}


# --- the default policy ----------------------------------------------------------------------------


def test_unworked_problems_are_tried_first_and_writers_spread():
    problems = [worked(1, attempts=10, gain_total=0.5), problem(2), problem(3)]
    plan = choose(HEADROOM_UCB, problems, slots=2, per_assignment=4)
    assert sorted(plan.problem_ids) == [2, 3]


def test_more_gain_for_the_same_cost_wins():
    problems = [worked(1, attempts=20, gain_total=0.1), worked(2, attempts=20, gain_total=1.0)]
    assert choose(HEADROOM_UCB, problems, slots=1, per_assignment=4).problem_ids == (2,)


def test_the_same_gain_for_less_cost_wins():
    problems = [worked(1, attempts=20, gain_total=0.5, cost_per_attempt=100.0),
                worked(2, attempts=20, gain_total=0.5, cost_per_attempt=5.0)]
    assert choose(HEADROOM_UCB, problems, slots=1, per_assignment=4).problem_ids == (2,)


def test_tokens_are_a_cost_too():
    problems = [worked(1, attempts=20, gain_total=0.5, cost_per_attempt=1.0, tokens=20 * 50_000),
                worked(2, attempts=20, gain_total=0.5, cost_per_attempt=1.0, tokens=20 * 1_000)]
    assert choose(HEADROOM_UCB, problems, slots=1, per_assignment=4).problem_ids == (2,)


def test_headroom_weighs_the_gain():
    """Same history; the problem nearer SOL has less to give."""
    problems = [worked(1, attempts=20, gain_total=0.5, best_sol=0.9),
                worked(2, attempts=20, gain_total=0.5, best_sol=0.6)]
    assert choose(HEADROOM_UCB, problems, slots=1, per_assignment=4).problem_ids == (2,)


def test_without_sol_scores_the_policy_works_from_speedups():
    problems = [worked(1, attempts=20, gain_total=0.5, best_speedup=9.0),
                worked(2, attempts=20, gain_total=0.5, best_speedup=1.2)]
    assert choose(HEADROOM_UCB, problems, slots=1, per_assignment=4).problem_ids == (2,)


def test_in_flight_attempts_lower_a_problems_index():
    means = CampaignMeans.of([worked(1, 20, 0.5)], CONFIG)
    idle, busy = worked(1, 20, 0.5), worked(1, 20, 0.5, in_flight=8)
    assert ucb_index(busy, means, CONFIG) < ucb_index(idle, means, CONFIG)


def test_a_good_problem_takes_several_writers_when_it_is_worth_it():
    problems = [worked(1, attempts=40, gain_total=4.0, cost_per_attempt=1.0),
                worked(2, attempts=40, gain_total=0.05, cost_per_attempt=50.0)]
    plan = choose(HEADROOM_UCB, problems, slots=3, per_assignment=1)
    assert plan.problem_ids == (1, 1, 1)


def test_the_index_is_finite_for_a_problem_without_any_cost_recorded():
    means = CampaignMeans.of([problem(1), problem(2)], CONFIG)
    assert 0 < ucb_index(problem(1), means, CONFIG) < float("inf")


# --- the baselines ---------------------------------------------------------------------------------


def test_round_robin_follows_the_campaign_order_and_keeps_its_cursor():
    problems = [problem(10, position=1), problem(20, position=0), problem(30, position=2)]
    plan = choose(ROUND_ROBIN, problems, slots=4, per_assignment=4, cursor=0)
    assert plan.problem_ids == (20, 10, 30, 20) and plan.cursor == 4
    assert choose(ROUND_ROBIN, problems, slots=1, per_assignment=4, cursor=plan.cursor).problem_ids == (10,)


def test_round_robin_skips_exhausted_problems_only():
    problems = [problem(1, exhausted=True), problem(2, best_sol=0.99), problem(3, stall=100)]
    assert choose(ROUND_ROBIN, problems, slots=3, per_assignment=4).problem_ids == (2, 3, 2)
    assert choose(ROUND_ROBIN, problems[:1], slots=3, per_assignment=4).problem_ids == ()


def test_greedy_takes_the_largest_headroom_then_the_least_worked():
    problems = [worked(1, 5, 0.5, best_sol=0.8), worked(2, 5, 0.5, best_sol=0.6), worked(3, 1, 0.1, best_sol=0.6)]
    assert choose(GREEDY_HEADROOM, problems, slots=2, per_assignment=4).problem_ids == (3, 2)


def test_an_unknown_policy_falls_back_on_the_default():
    problems = [worked(1, attempts=20, gain_total=0.1), worked(2, attempts=20, gain_total=1.0)]
    assert choose("llm", problems, slots=1, per_assignment=4) == choose(HEADROOM_UCB, problems, 1, 4)


def test_no_slots_no_choices():
    assert choose(HEADROOM_UCB, [problem(1)], slots=0, per_assignment=4).problem_ids == ()


@pytest.mark.parametrize("policy", [HEADROOM_UCB, GREEDY_HEADROOM, ROUND_ROBIN])
def test_ten_thousand_problems_plan_quickly(policy):
    import time

    problems = [worked(i, attempts=i % 17, gain_total=(i % 7) / 10, cost_per_attempt=1 + i % 5) for i in range(10_000)]
    started = time.perf_counter()
    plan = choose(policy, problems, slots=100, per_assignment=4)
    assert len(plan.problem_ids) == 100
    assert time.perf_counter() - started < 1.0  # the bench reports the real figure; this catches O(n^2)


def test_the_fast_index_is_the_documented_formula():
    """`UcbIndex` inlines the score; recompute the index from its definition, term by term."""
    import math
    import random

    rng = random.Random(3)
    problems = [worked(i, attempts=rng.randint(0, 60), gain_total=rng.random() * 2,
                       cost_per_attempt=rng.uniform(0.1, 50),
                       tokens=rng.randint(0, 10**6), in_flight=rng.randint(0, 8),
                       best_speedup=rng.choice([None, 0.5, 1.0, 3.0, 50.0]), best_sol=rng.choice([None, 0.7]))
                for i in range(200)]
    means = CampaignMeans.of(problems, CONFIG)
    for stats in problems:
        seen = stats.recent_attempts + stats.in_flight + CONFIG.prior_attempts
        mean_gain = (stats.recent_gain + CONFIG.prior_attempts * means.gain_per_attempt) / seen
        bonus = CONFIG.exploration * means.gain_per_attempt * math.sqrt(
            2 * math.log(means.total_attempts + 2) / (stats.attempts + stats.in_flight + 1))
        cost = (stats.cost(CONFIG) + CONFIG.cost_prior_attempts * means.cost_per_attempt) / (
            stats.attempts + CONFIG.cost_prior_attempts)
        now = score(stats)
        later = now + (1 - now) * min(mean_gain + bonus, 0.99)
        sol_speedup = sol_speedup_of(stats, CONFIG.assumed_sol_speedup)
        expected = (math.log(speedup_at(later, sol_speedup)) - math.log(speedup_at(now, sol_speedup))) / (
            cost ** CONFIG.cost_exponent)
        assert ucb_index(stats, means, CONFIG) == pytest.approx(expected, rel=1e-9)


def speedup_at(score_: float, sol_speedup: float) -> float:
    """T_b / T_k from S = 1 / (1 + (T_k − T_sol) / (T_b − T_sol)) with T_b = 1, T_sol = 1 / R."""
    sol_time = 1 / sol_speedup
    return 1 / (sol_time + (1 / score_ - 1) * (1 - sol_time))


@pytest.mark.parametrize("sol_speedup", [2.0, 10.0, 30.0])
@pytest.mark.parametrize("measured", [0.3, 0.6, 0.9])
def test_the_sol_speedup_is_recovered_from_a_measured_score_and_its_speedup(sol_speedup, measured):
    stats = problem(1, best_sol=measured, best_speedup=speedup_at(measured, sol_speedup))
    assert sol_speedup_of(stats, 10.0) == pytest.approx(sol_speedup)


def test_without_a_measured_score_or_near_the_baseline_the_sol_speedup_is_assumed():
    assert sol_speedup_of(problem(1, best_speedup=3.0), 10.0) == 10.0
    assert sol_speedup_of(problem(1, best_sol=0.51, best_speedup=1.02), 10.0) == 10.0
    assert sol_speedup_of(problem(1, best_sol=0.8), 7.0) == 7.0


def test_the_same_share_of_headroom_is_worth_more_where_sol_is_far():
    """Two problems at S = 0.7 with the same history and cost: the one whose SOL is a 30x speedup
    gains more log speedup from closing the same share than the one whose SOL is 2x."""
    near = worked(1, attempts=8, gain_total=0.4, best_sol=0.7, best_speedup=speedup_at(0.7, 2.0))
    far = worked(2, attempts=8, gain_total=0.4, best_sol=0.7, best_speedup=speedup_at(0.7, 30.0))
    assert choose(HEADROOM_UCB, [near, far], 1, 1).problem_ids == (2,)  # a tie would go to the first


def random_problems(count: int, seed: int) -> list[ProblemStats]:
    import random

    rng = random.Random(seed)
    return [worked(i, attempts=rng.randint(0, 60), gain_total=rng.random() * 2, cost_per_attempt=rng.uniform(0.1, 50),
                   tokens=rng.randint(0, 10**6), in_flight=rng.choice([0, 0, 4, 8]),
                   best_speedup=rng.choice([None, 0.0, 0.5, 1.0, 1.01, 3.0, 50.0]),
                   best_sol=rng.choice([None, None, 0.0, 0.3, 0.5, 0.7, 0.95, 1.0]),
                   position=rng.randint(0, 5))  # shared positions: ties broken by position, then id
            for i in range(count)]


def test_the_index_of_every_problem_at_once_is_the_one_by_one_index():
    from services.planner.policy import UcbIndex

    problems = random_problems(500, 5)
    index = UcbIndex(CampaignMeans.of(problems, CONFIG), CONFIG)
    assert list(index.negated_all(problems)) == pytest.approx([index.negated(p) for p in problems], rel=1e-12)


@pytest.mark.parametrize("slots", [1, 7, 60, 400])
def test_choosing_from_the_best_few_is_choosing_from_all(slots):
    """`choose` ranks only the `slots` best problems; the plain greedy over every problem picks the same."""
    import heapq
    from dataclasses import replace

    from services.planner.policy import UcbIndex

    problems = [p for p in random_problems(300, slots) if not retired(p)]
    index = UcbIndex(CampaignMeans.of(problems, CONFIG), CONFIG)
    heap = [(index.negated(p), p.position, p.problem_id, p) for p in problems]
    heapq.heapify(heap)
    expected = []
    for _ in range(slots):
        _, position, problem_id, stats = heapq.heappop(heap)
        expected.append(problem_id)
        stats = replace(stats, in_flight=stats.in_flight + 4)
        heapq.heappush(heap, (index.negated(stats), position, problem_id, stats))
    assert choose(HEADROOM_UCB, problems, slots, 4).problem_ids == tuple(expected)

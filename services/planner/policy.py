"""Who works on what next: pure functions from a campaign's per-problem state to the problems the
idle writers get. No DB, no clock, no randomness: the simulator (`bench/planner_sim.py`) and the
planner's tick call the same code.

Three policies (`choose`):

- `round_robin`: the campaign's problems in order, wrapping around; the baseline.
- `greedy_headroom`: always the problem furthest from SOL (largest 1 − S), the least worked first.
- `headroom_ucb`, the default: per problem an upper confidence bound on the share of the headroom
  1 − S the next attempt closes, turned into the gain in log speedup it would bring (the campaign's
  geomean speedup is what the planner is judged on), per unit of cost (GPU-seconds plus tokens).
  Problems at S ≥ `retire_score` (a measured SOL score only), stalled for `stall_attempts` finished
  attempts, whose writer found nothing left to try, or that no attempt ever passed while
  `invalid_reference_attempts` of them ended INVALID_REFERENCE (the reference itself fails on this
  hardware or under the workloads' inputs: no solution can pass), are retired.

S is the SOL score, 0.5 at the baseline and 1.0 at the hardware limit. While the evaluator does not
score SOL (`sol_score` NULL), S is estimated from the speedup (`estimated_score`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

HEADROOM_UCB = "headroom_ucb"
GREEDY_HEADROOM = "greedy_headroom"
ROUND_ROBIN = "round_robin"
LLM = "llm"  # a model's advice, checked, with headroom_ucb for the rest (`advisor.py`)
POLICIES = (HEADROOM_UCB, GREEDY_HEADROOM, ROUND_ROBIN, LLM)
DEFAULT_POLICY = HEADROOM_UCB
BASELINE_SCORE = 0.5  # S of the reference itself: where every problem starts
MAX_ESTIMATE = 0.999
MAX_INVERSE = 1.0 / 1.2  # an R implied by a measured S is clamped to [1.2, 100]
MAX_SHARE = 0.99  # the expected share of the headroom an attempt closes, optimism included, at most


@dataclass(frozen=True)
class PolicyConfig:
    """The default policy's knobs; the defaults are the ones `bench/planner_sim.py` reports."""

    retire_score: float = 0.95  # a measured S at or above it retires the problem
    stall_attempts: int = 48  # K: finished attempts without a gain that retire a problem
    invalid_reference_attempts: int = 3  # INVALID_REFERENCE attempts that retire a problem none passed
    min_gain: float = 0.05  # a gain closes at least this share of the headroom 1 − S
    window: int = 32  # the latest finished attempts a problem's mean gain is taken over
    exploration: float = 3.0  # weight of the UCB bonus
    cost_exponent: float = 1.0  # 1: gain per unit of cost; less: hedge against cheap problems' noise
    prior_attempts: float = 2.0  # pseudo-attempts at the campaign's mean gain for a new problem
    cost_prior_attempts: float = 0.5  # the same for the cost per attempt (an attempt's cost is no lottery)
    prior_gain: float = 0.1  # the mean gain per attempt assumed before the campaign has any
    assumed_sol_speedup: float = 10.0  # R: T_b / T_sol assumed while the SOL score is unknown
    estimate_cap: float = 0.9  # an estimated S never retires a problem by `retire_score`
    gpu_s_per_token: float = 0.005  # 1,000 tokens cost as much as 5 GPU-seconds ($5/M vs $3.6/h)
    diverse_after: int = 6  # stalled attempts after which the parent is a diverse one
    writer: str | None = None  # the writers' kind (Settings.writer): only its exhausted searches count; None: any


@dataclass(frozen=True)
class ProblemStats:
    """One problem of a campaign as the planner sees it. Attempts are counted once finished."""

    problem_id: int
    position: int = 0  # the problem's place in the campaign (round-robin order, tie-break)
    attempts: int = 0
    recent_attempts: int = 0  # the latest `window` finished attempts (fewer if there are fewer)...
    recent_gain: float = 0.0  # ...and the sum of their gains: the share of the headroom each closed
    gain: float = 0.0  # the same sum over every finished attempt
    stall: int = 0  # finished attempts since the last gain of at least `min_gain` (all if none)
    failures: int = 0  # finished attempts other than PASSED
    invalid_references: int = 0  # finished attempts whose reference failed (INVALID_REFERENCE)
    best_speedup: float | None = None  # over the eager reference, of the best PASSED attempt
    best_sol: float | None = None  # measured SOL score of the best PASSED attempt, when scored
    gpu_s: float = 0.0
    tokens: int = 0
    in_flight: int = 0  # attempts promised to active assignments and not finished yet
    exhausted: bool = False  # the writer's last assignment here found nothing to try

    def cost(self, config: PolicyConfig) -> float:
        return self.gpu_s + self.tokens * config.gpu_s_per_token


@dataclass(frozen=True)
class Plan:
    """`problem_ids`: one a new assignment, best first; `cursor`: the round-robin cursor after it."""

    problem_ids: tuple[int, ...]
    retired: frozenset[int]
    cursor: int


def estimated_score(speedup: float | None, config: PolicyConfig = PolicyConfig(),
                    cap: float | None = None) -> float:
    """S from a speedup over the baseline, assuming T_sol = T_b / R (R = `assumed_sol_speedup`).

    S = 1 / (1 + (T_k − T_sol) / (T_b − T_sol)) with T_b = 1 and T_k = 1 / speedup: 0.5 at a speedup
    of 1 (the baseline), 1.0 at a speedup of R; capped at `estimate_cap`, so that only a measured
    score retires a problem for being near SOL. No PASSED attempt yet: the baseline, 0.5.
    """
    if speedup is None or speedup <= 0:
        return BASELINE_SCORE
    inverse = 1.0 / config.assumed_sol_speedup
    score = 1.0 / (1.0 + max(0.0, 1.0 / speedup - inverse) / (1.0 - inverse))
    return min(score, config.estimate_cap if cap is None else cap)


def merit(sol_score: float | None, speedup: float | None, config: PolicyConfig = PolicyConfig()) -> float:
    """An attempt's S for measuring gains: measured, else estimated (uncapped below 1)."""
    return sol_score if sol_score is not None else estimated_score(speedup, config, cap=MAX_ESTIMATE)


def gain(best_before: float | None, achieved: float) -> float:
    """The share of the headroom 1 − S that an attempt scoring `achieved` closed: 0 when it did not
    beat the best; the first PASSED attempt is measured from the baseline (0.5)."""
    before = BASELINE_SCORE if best_before is None else best_before
    if achieved <= before or before >= 1.0:
        return 0.0
    return min(1.0, (achieved - before) / (1.0 - before))


def score(stats: ProblemStats, config: PolicyConfig = PolicyConfig()) -> float:
    """The problem's S: measured when the evaluator scored SOL, else estimated from the speedup."""
    if stats.best_sol is not None:
        return stats.best_sol
    return estimated_score(stats.best_speedup, config)


def retired(stats: ProblemStats, config: PolicyConfig = PolicyConfig()) -> bool:
    """Near SOL (measured), stalled for K finished attempts, nothing left to try, or unpassable:
    never passed, and its reference failed in `invalid_reference_attempts` attempts."""
    near_sol = stats.best_sol is not None and stats.best_sol >= config.retire_score
    return near_sol or stats.stall >= config.stall_attempts or stats.exhausted or unpassable(stats, config)


def unpassable(stats: ProblemStats, config: PolicyConfig = PolicyConfig()) -> bool:
    """No attempt passed, and the reference failed in `invalid_reference_attempts` of them: no
    writer can do anything here (every policy skips it, as it skips an exhausted problem)."""
    return stats.best_speedup is None and stats.invalid_references >= config.invalid_reference_attempts


@dataclass(frozen=True)
class CampaignMeans:
    """Campaign-wide priors for problems with little history: mean gain and cost per attempt."""

    total_attempts: int
    gain_per_attempt: float
    cost_per_attempt: float

    @classmethod
    def of(cls, problems: Sequence[ProblemStats], config: PolicyConfig) -> CampaignMeans:
        total, gain, gpu_s, tokens = 0, 0.0, 0.0, 0
        for p in problems:  # one pass: a tick does this over 10,000 problems
            total += p.attempts
            gain += p.gain
            gpu_s += p.gpu_s
            tokens += p.tokens
        cost = gpu_s + tokens * config.gpu_s_per_token
        return cls(total, (gain + config.prior_attempts * config.prior_gain) / (total + config.prior_attempts),
                   cost / total if total and cost > 0 else 1.0)


def ucb_index(stats: ProblemStats, means: CampaignMeans, config: PolicyConfig) -> float:
    """Expected gain in log speedup per unit of cost, optimistic by the uncertainty of few attempts.

    The gain of an attempt is the share of the headroom 1 − S it closed (0 when it did not beat the
    best). Its expected value g is the mean over the problem's latest `window` finished attempts,
    with in-flight attempts counted as gaining nothing (so writers spread) and `prior_attempts`
    pseudo-attempts at the campaign's mean; the UCB1 bonus `exploration * mean * sqrt(2 ln N /
    (n + 1))` is added. The index is log x(S + g (1 − S)) − log x(S), the gain in log speedup if the
    next attempt closes that share, where x(S) is the speedup at S on this problem (its R = T_b /
    T_sol from the measured S and speedup, `sol_speedup_of`; assumed when not measured), divided by
    the problem's mean cost per attempt (shrunk toward the campaign's by `cost_prior_attempts`) to
    the power `cost_exponent`. A share of headroom is worth more in log speedup on a problem whose
    SOL is far (R = 30) than on one whose SOL is near (R = 2): the geomean counts the former more.
    """
    return UcbIndex(means, config)(stats)


class UcbIndex:
    """`ucb_index` with the campaign-wide terms computed once: a tick ranks 10,000 problems."""

    def __init__(self, means: CampaignMeans, config: PolicyConfig) -> None:
        self.prior = config.prior_attempts
        self.prior_gain = config.prior_attempts * means.gain_per_attempt
        self.cost_prior = config.cost_prior_attempts
        self.prior_cost = config.cost_prior_attempts * means.cost_per_attempt
        self.bonus = config.exploration * means.gain_per_attempt * math.sqrt(2.0 * math.log(means.total_attempts + 2.0))
        self.token_cost = config.gpu_s_per_token
        self.exponent = config.cost_exponent
        self.inverse = 1.0 / config.assumed_sol_speedup
        self.span = 1.0 / (1.0 - self.inverse)
        self.cap = config.estimate_cap

    def __call__(self, stats: ProblemStats) -> float:
        return -self.negated(stats)

    def negated_all(self, problems: Sequence[ProblemStats]) -> np.ndarray:
        """`negated` of every problem at once (the same arithmetic on arrays; `test_policy` checks
        that the two agree)."""
        def column(values) -> np.ndarray:
            return np.fromiter(values, dtype=np.float64, count=len(problems))

        nan = math.nan
        measured = column(nan if p.best_sol is None else p.best_sol for p in problems)
        speedup = column(nan if p.best_speedup is None or p.best_speedup <= 0 else p.best_speedup for p in problems)
        attempts = column(p.attempts for p in problems)
        in_flight = column(p.in_flight for p in problems)
        with np.errstate(divide="ignore", invalid="ignore"):
            estimate = np.minimum(1.0 / (1.0 + np.maximum(1.0 / speedup - self.inverse, 0.0) * self.span), self.cap)
            score_ = np.where(np.isnan(measured), np.where(np.isnan(speedup), BASELINE_SCORE, estimate), measured)
            mean_gain = (column(p.recent_gain for p in problems) + self.prior_gain) / (
                column(p.recent_attempts for p in problems) + in_flight + self.prior)
            bonus = self.bonus / np.sqrt(attempts + in_flight + 1.0)
            cost = (column(p.gpu_s for p in problems) + column(p.tokens for p in problems) * self.token_cost
                    + self.prior_cost) / (attempts + self.cost_prior)
            now = np.maximum(score_, 0.01)
            implied = (1.0 / speedup - (1.0 / now - 1.0)) / (2.0 - 1.0 / now)
            known = ~np.isnan(measured) & ~np.isnan(speedup) & (np.abs(now - BASELINE_SCORE) > 0.02)
            inverse = np.where(known, np.clip(np.nan_to_num(implied, nan=0.01), 0.01, MAX_INVERSE), self.inverse)
            later = now + (1.0 - now) * np.minimum(mean_gain + bonus, MAX_SHARE)
            value = np.log((inverse + (1.0 / now - 1.0) * (1.0 - inverse))
                           / (inverse + (1.0 / later - 1.0) * (1.0 - inverse)))
            keys = -value / np.maximum(cost, 1e-9) ** self.exponent
        return np.where(score_ >= 1.0, 0.0, keys)

    def negated(self, stats: ProblemStats) -> float:
        """Minus the index (the heap's key); written for speed, `test_policy` checks it against the
        definition term by term."""
        score_ = stats.best_sol
        if score_ is None:
            speedup = stats.best_speedup
            if speedup is not None and speedup > 0:  # `estimated_score`, inlined
                gap = 1.0 / speedup - self.inverse
                score_ = 1.0 / (1.0 + (gap if gap > 0.0 else 0.0) * self.span)
                if score_ > self.cap:
                    score_ = self.cap
            else:
                score_ = BASELINE_SCORE
        in_flight = stats.in_flight
        mean_gain = (stats.recent_gain + self.prior_gain) / (stats.recent_attempts + in_flight + self.prior)
        bonus = self.bonus / math.sqrt(stats.attempts + in_flight + 1.0)
        cost = (stats.gpu_s + stats.tokens * self.token_cost + self.prior_cost) / (stats.attempts + self.cost_prior)
        if score_ >= 1.0:
            return 0.0
        if score_ < 0.01:
            score_ = 0.01
        speedup = stats.best_speedup  # `sol_speedup_of`, inlined: 1 / R
        inverse = self.inverse
        if stats.best_sol is not None and speedup is not None and speedup > 0 and \
                abs(score_ - BASELINE_SCORE) > 0.02:  # score_ is the measured S here
            inverse = (1.0 / speedup - (1.0 / score_ - 1.0)) / (2.0 - 1.0 / score_)
            inverse = 0.01 if inverse < 0.01 else (MAX_INVERSE if inverse > MAX_INVERSE else inverse)
        share = mean_gain + bonus
        later = score_ + (1.0 - score_) * (share if share < MAX_SHARE else MAX_SHARE)
        # log x(later) - log x(now), x(S) = 1 / (1/R + (1/S - 1)(1 - 1/R)): `_log_speedup`, one log
        value = math.log((inverse + (1.0 / score_ - 1.0) * (1.0 - inverse))
                         / (inverse + (1.0 / later - 1.0) * (1.0 - inverse)))
        return -value / (cost if cost > 1e-9 else 1e-9) ** self.exponent


def sol_speedup_of(stats: ProblemStats, assumed: float) -> float:
    """R = T_b / T_sol, the speedup at S = 1, implied by the best attempt's measured S and speedup x:
    from 1/x = 1/R + (1/S − 1)(1 − 1/R), 1/R = (1/x − (1/S − 1)) / (2 − 1/S). `assumed` without a
    measured S, or when S is within 0.02 of the baseline's 0.5 (where x says nothing about R);
    clamped to [1.2, 100]."""
    measured, speedup = stats.best_sol, stats.best_speedup
    if measured is None or speedup is None or speedup <= 0 or abs(measured - BASELINE_SCORE) <= 0.02:
        return assumed
    measured = max(measured, 0.01)
    inverse = (1.0 / speedup - (1.0 / measured - 1.0)) / (2.0 - 1.0 / measured)
    return 1.0 / min(max(inverse, 0.01), MAX_INVERSE)


def _log_speedup(score_: float, sol_speedup: float) -> float:
    """log(T_b / T_k) at S = `score_` on a problem whose speedup at S = 1 is `sol_speedup`."""
    inverse = 1.0 / sol_speedup
    return -math.log(inverse + (1.0 / score_ - 1.0) * (1.0 - inverse))


def choose(policy: str, problems: Sequence[ProblemStats], slots: int, per_assignment: int,
           config: PolicyConfig = PolicyConfig(), cursor: int = 0) -> Plan:
    """Problems for `slots` new assignments of `per_assignment` attempts each.

    A problem may get several; each assignment counts as `per_assignment` attempts in flight before
    the next is chosen, so writers spread over equally good problems. Fewer than `slots` (possibly
    none) when every problem is retired. Unknown policy names fall back on the default.
    """
    if policy == ROUND_ROBIN:
        return _round_robin(problems, slots, cursor, config)
    gone = frozenset(p.problem_id for p in problems if retired(p, config)) if policy != GREEDY_HEADROOM \
        else frozenset(p.problem_id for p in problems if p.exhausted or unpassable(p, config))
    open_problems = [p for p in problems if p.problem_id not in gone]
    if slots <= 0 or not open_problems:
        return Plan((), gone, cursor)
    if policy == GREEDY_HEADROOM:
        rank = _greedy_rank(config)
        heap = [(rank(p), p.position, p.problem_id, p) for p in open_problems]
    else:
        index = UcbIndex(CampaignMeans.of(problems, config), config)
        rank = index.negated
        heap = _top(index.negated_all(open_problems), open_problems, slots)
    heapq.heapify(heap)
    chosen = []
    for _ in range(slots):
        _, position, problem_id, stats = heapq.heappop(heap)
        chosen.append(problem_id)
        stats = replace(stats, in_flight=stats.in_flight + per_assignment)
        heapq.heappush(heap, (rank(stats), position, problem_id, stats))
    return Plan(tuple(chosen), gone, cursor)


def _top(keys: np.ndarray, problems: Sequence[ProblemStats], slots: int) -> list[tuple]:
    """Heap entries of the `slots` best problems. Enough for `slots` picks: a problem outside them
    is picked only once all of them were (a pick only lowers the picked problem's index)."""
    if slots < len(problems):
        positions = np.fromiter((p.position for p in problems), dtype=np.float64, count=len(problems))
        order = np.lexsort((positions, keys))[:slots]  # by key, then by position: the heap's order
    else:
        order = range(len(problems))
    return [(float(keys[i]), problems[i].position, problems[i].problem_id, problems[i]) for i in order]


def _greedy_rank(config: PolicyConfig):
    return lambda stats: (-(1.0 - score(stats, config)), stats.attempts + stats.in_flight)


def _round_robin(problems: Sequence[ProblemStats], slots: int, cursor: int, config: PolicyConfig) -> Plan:
    """In campaign order from `cursor`, skipping problems whose search space is exhausted or that
    no solution can pass."""
    ordered = sorted(problems, key=lambda p: p.position)
    gone = frozenset(p.problem_id for p in ordered if p.exhausted or unpassable(p, config))
    if len(gone) == len(ordered):
        return Plan((), gone, cursor)
    chosen = []
    while len(chosen) < slots:
        stats = ordered[cursor % len(ordered)]
        cursor += 1
        if stats.problem_id not in gone:
            chosen.append(stats.problem_id)
    return Plan(tuple(chosen), gone, cursor)

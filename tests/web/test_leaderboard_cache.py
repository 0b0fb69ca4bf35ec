"""services.web.leaderboard_cache: the same board as the uncached query, recomputing only what changed."""

from __future__ import annotations

from sqlalchemy import event, update

from services.web.leaderboard_cache import LeaderboardCache
from shared.db import AttemptRow
from shared.leaderboard import leaderboard


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def boards(db, cache, campaign_id=None):
    with db.session() as session:
        cached = cache.leaderboard(session, campaign_id)
        fresh = leaderboard(session, campaign_id)
    return cached, fresh


def same(cached, fresh) -> bool:
    return cached.problems == fresh.problems and cached.summary == fresh.summary


def test_recounting_every_request_follows_every_change(db, seed):
    cache = LeaderboardCache(recount_s=0)
    p1, p2 = seed.problem("p1"), seed.problem("p2")
    seed.attempt(p1, "PASSED", speedup=1.5, latency_ms=1.0, minute=1)
    assert same(*boards(db, cache))

    seed.attempt(p2, "COMPILE_ERROR", minute=2)  # a new attempt
    cached, fresh = boards(db, cache)
    assert same(cached, fresh) and [e.status for e in cached.problems] == ["PASSED", "COMPILE_ERROR"]

    running = seed.attempt(p2, "RUNNING", minute=3)
    assert same(*boards(db, cache))
    with db.session() as session:  # the evaluator finishes it: status and figures together
        session.execute(update(AttemptRow).where(AttemptRow.id == running).values(
            status="PASSED", speedup=4.0, latency_ms=0.5, sol_score=0.9))
    cached, fresh = boards(db, cache)
    assert same(cached, fresh) and cached.problems[0].name == "p2"

    seed.problem("p3")  # a new problem
    cached, fresh = boards(db, cache)
    assert same(cached, fresh) and len(cached.problems) == 3


def finish(seed, problem_id: int, status: str, **figures) -> str:
    """An attempt finished the evaluator's way: its traces rows come with it."""
    attempt_id = seed.attempt(problem_id, status, **figures)
    seed.trace(attempt_id, "w1", status, latency_ms=figures.get("latency_ms"))
    return attempt_id


def test_an_attempt_the_evaluator_finishes_shows_at_once(db, seed):
    clock = Clock()
    cache = LeaderboardCache(recount_s=3600, clock=clock)
    p1, p2 = seed.problem("p1"), seed.problem("p2")
    finish(seed, p1, "PASSED", speedup=1.5, latency_ms=1.0, minute=1)
    assert same(*boards(db, cache))

    finish(seed, p2, "PASSED", speedup=3.0, latency_ms=1.0, minute=2)
    cached, fresh = boards(db, cache)
    assert same(cached, fresh) and cached.problems[0].name == "p2"

    seed.attempt(p1, "TIMEOUT", minute=3)  # finished without traces rows: seen on the next recount
    cached, fresh = boards(db, cache)
    assert cached.problems[1].attempts == 1 and fresh.problems[1].attempts == 2
    clock.now += 3600
    assert same(*boards(db, cache))


def test_only_changed_problems_are_recomputed(db, seed):
    cache = LeaderboardCache(recount_s=3600)
    ids = [seed.problem(f"p{i}") for i in range(5)]
    for problem_id in ids:
        finish(seed, problem_id, "PASSED", speedup=2.0, latency_ms=1.0)
    boards(db, cache)
    assert cache.recomputed == 5

    statements = []

    def record(*args) -> None:
        statements.append(args[2])

    event.listen(db.engine, "before_cursor_execute", record)
    with db.session() as session:
        cache.leaderboard(session)
    event.remove(db.engine, "before_cursor_execute", record)
    assert cache.recomputed == 5
    assert len(statements) == 2  # the problems and the newest traces id: nothing counted, nothing ranked

    finish(seed, ids[2], "TIMEOUT")
    cached, fresh = boards(db, cache)
    assert cache.recomputed == 6 and same(cached, fresh)


def test_changes_that_keep_the_counts_show_up_after_max_age(db, seed):
    clock = Clock()
    cache = LeaderboardCache(recount_s=0, max_age_s=60.0, refresh_per_request=2, clock=clock)
    ids = [seed.problem(f"p{i}") for i in range(3)]
    for problem_id in ids:
        seed.attempt(problem_id, "PASSED", speedup=2.0, latency_ms=1.0)
    boards(db, cache)
    with db.session() as session:  # a later rescoring: no status changes
        session.execute(update(AttemptRow).values(sol_score=0.75))

    cached, fresh = boards(db, cache)
    assert not same(cached, fresh) and all(e.sol_score is None for e in cached.problems)

    clock.now += 61
    cached, _ = boards(db, cache)  # at most two of the three aged problems per request
    assert sorted(e.sol_score for e in cached.problems if e.sol_score) == [0.75, 0.75]
    cached, fresh = boards(db, cache)
    assert same(cached, fresh)


def test_campaign_scopes_are_kept_apart(db, seed):
    cache = LeaderboardCache(recount_s=0)
    p1, p2 = seed.problem("p1"), seed.problem("p2")
    campaign = seed.campaign([p1])
    seed.attempt(p1, "PASSED", speedup=2.0, latency_ms=1.0, campaign_id=campaign)
    seed.attempt(p1, "PASSED", speedup=5.0, latency_ms=1.0)
    seed.attempt(p2, "TIMEOUT")

    for scope in (campaign, None, campaign):
        cached, fresh = boards(db, cache, scope)
        assert same(cached, fresh)
    assert [e.speedup for e in boards(db, cache, campaign)[0].problems] == [2.0]

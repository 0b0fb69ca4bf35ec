"""Ticks against a real SQLite DB: the state the policy sees, budgets, briefs, retirement, and
concurrent ticks that must never hold more assignments than writers."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from plannerkit import Attempts, WriteQueue, active, add_problems, assignments, best_of, close
from services.planner.campaign import Budgets, assignment_done, create_campaign, pause_campaign, resume_campaign
from services.planner.campaign import add_problems as add_campaign_problems
from services.planner.policy import PolicyConfig, gain, merit
from services.planner.state import StateCache, read_state
from services.planner.tick import PlannerConfig, tick
from shared.db import AssignmentRow, CampaignRow, Database, utcnow


def new_campaign(db: Database, problem_ids: list[int], writers: int = 2, per_assignment: int = 3,
                 policy: str = "headroom_ucb", budgets: Budgets = Budgets(), device: str = "cpu") -> int:
    return create_campaign(db, "t", problem_ids, device, writers, per_assignment, policy=policy, budgets=budgets)


def status(db: Database, campaign_id: int) -> str:
    with db.session() as session:
        return session.get(CampaignRow, campaign_id).status


def reason(db: Database, campaign_id: int) -> str | None:
    with db.session() as session:
        return session.get(CampaignRow, campaign_id).status_reason


def stats_of(db: Database, campaign_id: int, problem_id: int, config: PolicyConfig = PolicyConfig()):
    with db.session() as session:
        state = read_state(session, campaign_id, config)
    return next(p for p in state.problems if p.problem_id == problem_id), state


# --- the state read from the DB --------------------------------------------------------------------


def test_the_state_folds_gains_stall_costs_and_best_in_finish_order(db):
    (problem,) = add_problems(db, 1)
    campaign_id = new_campaign(db, [problem])
    add = Attempts(db).add
    add(problem, campaign_id, "COMPILE_ERROR", minute=0, gpu_seconds=1.0, tokens=100)
    add(problem, campaign_id, "PASSED", sol_score=0.5, speedup=1.0, minute=1, gpu_seconds=2.0)  # the baseline: no gain
    add(problem, campaign_id, "PASSED", sol_score=0.6, speedup=1.5, minute=2)  # 0.1 of 0.5 headroom: 0.2
    add(problem, campaign_id, "PASSED", sol_score=0.7, speedup=2.0, minute=3, tokens=50)  # 0.1 of 0.4: 0.25
    add(problem, campaign_id, "INCORRECT_NUMERICAL", minute=4)
    add(problem, campaign_id, "PASSED", sol_score=0.65, speedup=1.8, minute=5)  # below the best: 0
    add(problem, campaign_id, "PENDING", minute=6)  # in flight: not counted yet
    add(problem, None, "PASSED", sol_score=0.99, minute=7)  # another campaign's

    stats, state = stats_of(db, campaign_id, problem, PolicyConfig(window=3))

    assert (stats.attempts, stats.failures, stats.stall) == (6, 2, 2)
    assert stats.gain == pytest.approx(0.45)
    assert (stats.recent_attempts, stats.recent_gain) == (3, pytest.approx(0.25))  # the last three
    assert (stats.best_sol, stats.best_speedup) == (0.7, 2.0)
    assert (stats.gpu_s, stats.tokens) == (3.0, 150)
    assert not stats.exhausted and stats.in_flight == 0
    assert state.spent.attempts == 7 and state.spent.tokens == 150


def test_without_sol_scores_gains_come_from_estimated_scores(db):
    (problem,) = add_problems(db, 1)
    campaign_id = new_campaign(db, [problem])
    speedups = [1.2, 1.1, 2.0, 30.0]
    for minute, speedup in enumerate(speedups):
        Attempts(db).add(problem, campaign_id, "PASSED", speedup=speedup, minute=minute)

    stats, _ = stats_of(db, campaign_id, problem)

    best, expected = None, 0.0
    for speedup in speedups:  # the same fold in Python, with the policy's own functions
        expected += gain(best, merit(None, speedup))
        best = max(best or 0.0, merit(None, speedup))
    assert stats.gain == pytest.approx(expected)
    assert stats.best_sol is None and stats.best_speedup == 30.0


def test_a_done_assignment_without_attempts_marks_the_problem_exhausted(db, queue):
    first, second = add_problems(db, 2)
    campaign_id = new_campaign(db, [first, second], writers=1, per_assignment=1)
    (assignment_id,) = tick(db, campaign_id, queue)
    close(db, assignment_id)  # the writer found nothing to try
    exhausted = assignments(db, campaign_id)[0].problem_id

    stats, _ = stats_of(db, campaign_id, exhausted)
    assert stats.exhausted
    for _ in range(3):  # from now on every assignment goes to the other problem
        (assignment_id,) = tick(db, campaign_id, queue)
        Attempts(db).add(queue.problems[-1], campaign_id, "COMPILE_ERROR", assignment_id=assignment_id)
        close(db, assignment_id)
    assert set(queue.problems[1:]) == {first, second} - {exhausted}


def test_cancelled_assignments_do_not_mark_the_problem_exhausted(db, queue):
    (problem,) = add_problems(db, 1)
    campaign_id = new_campaign(db, [problem], writers=1)
    (assignment_id,) = tick(db, campaign_id, queue)
    close(db, assignment_id, "CANCELLED")  # paused before any attempt
    assert not stats_of(db, campaign_id, problem)[0].exhausted


def test_in_flight_counts_what_active_assignments_still_owe(db, queue):
    (problem,) = add_problems(db, 1)
    campaign_id = new_campaign(db, [problem], writers=2, per_assignment=3)
    first, second = tick(db, campaign_id, queue)
    Attempts(db).add(problem, campaign_id, "PASSED", speedup=1.0, assignment_id=first)
    Attempts(db).add(problem, campaign_id, "PENDING", assignment_id=first)

    stats, state = stats_of(db, campaign_id, problem)
    assert stats.in_flight == 2 + 3  # first: 3 less 1 finished; second: 3
    assert {(a.assignment_id, a.made, a.finished) for a in state.active} == {(first, 2, 1), (second, 0, 0)}


# --- what a tick creates ---------------------------------------------------------------------------


def test_the_default_policy_spreads_writers_over_unworked_problems(db, queue):
    problems = add_problems(db, 3)
    campaign_id = new_campaign(db, problems, writers=3)
    created = tick(db, campaign_id, queue)
    assert len(created) == 3 and sorted(queue.problems) == sorted(problems)
    for row in assignments(db, campaign_id):
        assert (row.language, row.parent_hash, row.guidance, row.budget_attempts) == ("pytorch", None, None, 3)


def test_an_assignment_names_the_best_parent_its_language_and_guidance(db, queue):
    (problem,) = add_problems(db, 1)
    campaign_id = new_campaign(db, [problem], writers=1, device="cuda")
    attempts = Attempts(db)
    attempts.add(problem, campaign_id, "PASSED", speedup=1.5, minute=0, language="cuda")
    best = attempts.add(problem, campaign_id, "PASSED", speedup=2.5, minute=1, language="triton")
    for minute in range(2, 5):
        attempts.add(problem, campaign_id, "COMPILE_ERROR", minute=minute,
                     message=f"kernel.py:{minute}: error: unexpected indent\nTraceback ...")

    tick(db, campaign_id, queue)

    (row,) = assignments(db, campaign_id)
    assert row.parent_hash == attempts.solution_of(best)
    assert row.language == "triton"
    assert row.guidance == "the last 3 attempts failed to compile: kernel.py:4: error: unexpected indent"


def test_a_problem_without_a_passed_attempt_gets_the_devices_language(db, queue):
    (problem,) = add_problems(db, 1)
    campaign_id = new_campaign(db, [problem], writers=1, device="cuda")
    tick(db, campaign_id, queue)
    assert assignments(db, campaign_id)[0].language == "cuda"


def test_when_every_problem_is_retired_the_campaign_stops(db, queue):
    problems = add_problems(db, 2)
    campaign_id = new_campaign(db, problems, writers=1)
    for problem in problems:
        Attempts(db).add(problem, campaign_id, "PASSED", speedup=3.0, sol_score=0.96)
    assert tick(db, campaign_id, queue) == []
    assert status(db, campaign_id) == "STOPPED"


def test_a_stopped_campaign_says_why(db, queue):
    (problem,) = add_problems(db, 1)
    campaign_id = new_campaign(db, [problem], writers=1)
    Attempts(db).add(problem, campaign_id, "PASSED", speedup=3.0, sol_score=0.96)
    tick(db, campaign_id, queue)
    assert reason(db, campaign_id) == "every problem retired (1)"


def test_a_continuous_campaign_waits_idle_and_a_problem_that_joins_gives_it_work(db, queue):
    problems = add_problems(db, 2)
    campaign_id = create_campaign(db, "c", problems, "cpu", 1, 2, continuous=True)
    for problem in problems:
        Attempts(db).add(problem, campaign_id, "PASSED", speedup=3.0, sol_score=0.96)
    assert tick(db, campaign_id, queue) == []
    assert (status(db, campaign_id), reason(db, campaign_id)) == ("RUNNING", "idle: every problem retired (2)")
    assert tick(db, campaign_id, queue) == []  # said once; still idle

    (joined,) = add_problems(db, 1, prefix="submitted")
    assert add_campaign_problems(db, campaign_id, problems + [joined]) == [joined]
    (assignment_id,) = tick(db, campaign_id, queue)
    assert queue.problems == [joined]
    assert (status(db, campaign_id), reason(db, campaign_id)) == ("RUNNING", None)


def test_a_search_one_writer_exhausted_is_open_to_another(db, queue):
    """The tuner found nothing left; a campaign that goes on with an LLM writer gives it the problem."""
    (problem,) = add_problems(db, 1)
    campaign_id = create_campaign(db, "c", [problem], "cpu", 1, 2, continuous=True)
    (assignment_id,) = tick(db, campaign_id, queue)
    with db.session() as session:
        session.get(AssignmentRow, assignment_id).writer = "tuner"
    close(db, assignment_id)
    tuner = PlannerConfig(policy=PolicyConfig(writer="tuner"))
    assert tick(db, campaign_id, queue, tuner) == []
    assert reason(db, campaign_id) == "idle: every problem retired (1)"

    assert len(tick(db, campaign_id, queue, PlannerConfig(policy=PolicyConfig(writer="llm:some-model")))) == 1
    assert reason(db, campaign_id) is None


def test_a_problem_whose_reference_keeps_failing_gets_no_more_writers(db, queue):
    """SOL-ExecBench's NVFP4 references fail on an H200 before sm_100, L2/043's under its own
    inputs: every attempt on such a problem is INVALID_REFERENCE, whatever the writer does."""
    unpassable, other = add_problems(db, 2)
    campaign_id = new_campaign(db, [unpassable, other], writers=2)
    for _ in range(PolicyConfig().invalid_reference_attempts):
        Attempts(db).add(unpassable, campaign_id, "INVALID_REFERENCE")
    tick(db, campaign_id, queue)
    assert {a.problem_id for a in assignments(db, campaign_id)} == {other}


def test_attempts_not_evaluated_count_for_no_problem(db, queue):
    """NOT_EVALUATED (the evaluators' faults outlasted every retry) is no verdict: a problem with
    as many of them as retire one by failed references, or by a stall, keeps its writers."""
    faulted, other = add_problems(db, 2)
    campaign_id = new_campaign(db, [faulted, other], writers=2)
    for _ in range(max(PolicyConfig().invalid_reference_attempts, PolicyConfig().stall_attempts)):
        Attempts(db).add(faulted, campaign_id, "NOT_EVALUATED")
    with db.session() as session:
        stats = next(p for p in read_state(session, campaign_id, PolicyConfig()).problems if p.problem_id == faulted)
    assert (stats.attempts, stats.failures, stats.stall) == (0, 0, 0)
    tick(db, campaign_id, queue)
    assert {a.problem_id for a in assignments(db, campaign_id)} == {faulted, other}


def test_paused_campaigns_get_nothing_until_resumed(db, queue):
    campaign_id = new_campaign(db, add_problems(db, 2), writers=2)
    pause_campaign(db, campaign_id)
    assert tick(db, campaign_id, queue) == []
    resume_campaign(db, campaign_id)
    assert len(tick(db, campaign_id, queue)) == 2


# --- budgets ---------------------------------------------------------------------------------------


def test_the_attempt_budget_is_never_promised_twice(db, queue):
    problems = add_problems(db, 3)
    campaign_id = new_campaign(db, problems, writers=3, per_assignment=3, budgets=Budgets(attempts=7))

    created = tick(db, campaign_id, queue)
    assert [r.budget_attempts for r in assignments(db, campaign_id)] == [3, 3, 1]

    for assignment_id, made in zip(created, (3, 1, 0)):  # the second and third stopped early
        row = next(r for r in assignments(db, campaign_id) if r.id == assignment_id)
        for _ in range(made):
            Attempts(db).add(row.problem_id, campaign_id, "COMPILE_ERROR", assignment_id=assignment_id)
    close(db, created[0])
    assert tick(db, campaign_id, queue) == []  # 3 made + 3 + 1 promised: nothing left
    close(db, created[1])
    (refill,) = tick(db, campaign_id, queue)  # the second made 1 of 3: two attempts came back
    assert assignments(db, campaign_id)[-1].budget_attempts == 2


def test_a_spent_attempt_budget_stops_the_campaign_once_the_writers_are_done(db, queue):
    (problem,) = add_problems(db, 1)
    campaign_id = new_campaign(db, [problem], writers=1, per_assignment=2, budgets=Budgets(attempts=2))
    (assignment_id,) = tick(db, campaign_id, queue)
    for _ in range(2):
        Attempts(db).add(problem, campaign_id, "PASSED", speedup=1.0, assignment_id=assignment_id)
    assert status(db, campaign_id) == "RUNNING"
    close(db, assignment_id)
    assert tick(db, campaign_id, queue) == []
    assert status(db, campaign_id) == "STOPPED"


@pytest.mark.parametrize(("budgets", "gpu_seconds", "tokens"), [
    (Budgets(gpu_s=10.0), 10.0, 0),
    (Budgets(tokens=1000), None, 1000),
], ids=["gpu-seconds", "tokens"])
def test_spent_gpu_seconds_or_tokens_stop_the_campaign(db, queue, budgets, gpu_seconds, tokens):
    (problem,) = add_problems(db, 1)
    campaign_id = new_campaign(db, [problem], writers=1, budgets=budgets)
    Attempts(db).add(problem, campaign_id, "PASSED", speedup=1.0, gpu_seconds=gpu_seconds and gpu_seconds / 2,
                     tokens=tokens // 2)
    assert len(tick(db, campaign_id, queue)) == 1  # half spent
    close(db, queue.sent[0])
    Attempts(db).add(problem, campaign_id, "PASSED", speedup=1.0, gpu_seconds=gpu_seconds and gpu_seconds / 2,
                     tokens=tokens // 2)
    assert tick(db, campaign_id, queue) == []
    assert status(db, campaign_id) == "STOPPED"


def test_the_wall_time_budget_stops_the_campaign_even_with_every_slot_busy(db, queue):
    campaign_id = new_campaign(db, add_problems(db, 1), writers=1, budgets=Budgets(wall_s=60.0))
    assert len(tick(db, campaign_id, queue)) == 1
    assert tick(db, campaign_id, queue, now=utcnow() + timedelta(seconds=30)) == []
    assert status(db, campaign_id) == "RUNNING"
    assert tick(db, campaign_id, queue, now=utcnow() + timedelta(seconds=61)) == []
    assert status(db, campaign_id) == "STOPPED"


# --- concurrency -----------------------------------------------------------------------------------


def test_concurrent_ticks_never_exceed_the_writers(db):
    """Eight threads, each with its own connection, tick the same campaign at once, repeatedly,
    while slots are freed; at no time are more than `writers` assignments active."""
    problems = add_problems(db, 4)
    writers = 3
    campaign_id = new_campaign(db, problems, writers=writers, per_assignment=1)
    queue, peaks, errors = WriteQueue(db), [], []
    start = threading.Barrier(8)

    def ticker() -> None:
        try:
            start.wait()
            for _ in range(5):
                tick(db, campaign_id, queue)
                peaks.append(active(db, campaign_id))
        except Exception as error:  # noqa: BLE001 - reported by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=ticker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for round_ in range(5):  # meanwhile, writers finish assignments
        for row in assignments(db, campaign_id):
            if row.status == "QUEUED" and round_ % 2:
                Attempts(db).add(row.problem_id, campaign_id, "COMPILE_ERROR", assignment_id=row.id)
                close(db, row.id)
    for thread in threads:
        thread.join()

    assert errors == []
    assert max(peaks) <= writers
    assert active(db, campaign_id) == writers
    assert len(queue.sent) == len(set(queue.sent)) == len(assignments(db, campaign_id))



# --- the planner process's cache -------------------------------------------------------------------


def test_with_a_cache_a_tick_sees_what_closed_assignments_did(db, queue):
    problems = add_problems(db, 3)
    campaign_id = new_campaign(db, problems, writers=1, per_assignment=1)
    cache = StateCache()
    (first,) = tick(db, campaign_id, queue, cache=cache)
    problem = queue.problems[-1]
    Attempts(db).add(problem, campaign_id, "PASSED", sol_score=0.96, assignment_id=first)  # near SOL: retire it
    close(db, first)

    tick(db, campaign_id, queue, cache=cache)

    assert queue.problems[-1] != problem  # the cache knew of the new attempt
    with db.session() as session:
        cached = cache.problems(session, campaign_id, PolicyConfig(), []).stats
        fresh = {p.problem_id: p for p in read_state(session, campaign_id, PolicyConfig()).problems}
    assert cached[problem] == fresh[problem]


def test_a_verdict_after_its_assignment_closed_is_seen_at_the_next_full_refresh(db, queue, monkeypatch):
    import types

    import services.planner.state as state_module

    now = [1000.0]  # the cache's clock, moved by hand: a slow database must not refresh it early
    monkeypatch.setattr(state_module, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    (problem,) = add_problems(db, 1)
    campaign_id = new_campaign(db, [problem], writers=1, per_assignment=1)
    cache = StateCache(full_every_s=60.0)
    (first,) = tick(db, campaign_id, queue, cache=cache)
    close(db, first)
    tick(db, campaign_id, queue, cache=cache)  # the writer stopped waiting; the verdict comes later
    Attempts(db).add(problem, campaign_id, "PASSED", speedup=2.0, assignment_id=first)
    with db.session() as session:
        assert cache.problems(session, campaign_id, PolicyConfig(), []).stats[problem].attempts == 0
    now[0] += 61.0
    with db.session() as session:
        assert cache.problems(session, campaign_id, PolicyConfig(), []).stats[problem].attempts == 1


def test_a_burst_of_reports_ticks_once(db, queue, monkeypatch):
    import services.planner.campaign as campaign_module

    campaign_id = new_campaign(db, add_problems(db, 4), writers=4, per_assignment=1)
    cache = StateCache()
    created = tick(db, campaign_id, queue, cache=cache)
    for assignment_id in created:
        Attempts(db).add(queue.problems[created.index(assignment_id)], campaign_id, "COMPILE_ERROR",
                         assignment_id=assignment_id)
        close(db, assignment_id)
    ticks = []
    real_tick = campaign_module.tick
    monkeypatch.setattr(campaign_module, "tick", lambda *a, **k: ticks.append(1) or real_tick(*a, **k))

    refills = [assignment_done(db, a, queue, cache=cache) for a in created]

    assert len(refills[0]) == 4 and refills[1:] == [[], [], []]
    assert len(ticks) == 1  # the other three reports were of slots the first tick refilled
    assert active(db, campaign_id) == 4


def test_with_a_cache_the_tick_records_the_best_of_reported_problems(db, queue):
    (problem,) = add_problems(db, 1)
    campaign_id = new_campaign(db, [problem], writers=1, per_assignment=1)
    cache = StateCache()
    (first,) = tick(db, campaign_id, queue, cache=cache)
    best = Attempts(db).add(problem, campaign_id, "PASSED", speedup=1.5, assignment_id=first)
    close(db, first)

    assert len(assignment_done(db, first, queue, cache=cache)) == 1  # no DB read of its own: the tick's
    assert best_of(db, campaign_id, problem) == best


def test_a_report_whose_tick_reads_everything_again_records_the_best(db, queue):
    """The report's tick is a full refresh (the cache is older than `full_every_s`: a slow attempt,
    a loaded machine): the best of the reported problem is recorded all the same."""
    (problem,) = add_problems(db, 1)
    campaign_id = new_campaign(db, [problem], writers=1, per_assignment=1)
    cache = StateCache(full_every_s=0.0)  # every tick reads everything again
    (first,) = tick(db, campaign_id, queue, cache=cache)
    best = Attempts(db).add(problem, campaign_id, "PASSED", speedup=1.5, assignment_id=first)
    close(db, first)

    assignment_done(db, first, queue, cache=cache)
    assert best_of(db, campaign_id, problem) == best


def test_reports_skip_the_tick_across_a_full_refresh(db, queue, monkeypatch):
    import services.planner.campaign as campaign_module

    campaign_id = new_campaign(db, add_problems(db, 2), writers=2, per_assignment=1)
    cache = StateCache(full_every_s=0.0)  # every tick reads everything again
    first, second = tick(db, campaign_id, queue, cache=cache)
    for assignment_id, problem in zip((first, second), queue.problems):
        Attempts(db).add(problem, campaign_id, "COMPILE_ERROR", assignment_id=assignment_id)
        close(db, assignment_id)
    ticks = []
    real_tick = campaign_module.tick
    monkeypatch.setattr(campaign_module, "tick", lambda *a, **k: ticks.append(1) or real_tick(*a, **k))

    assert len(assignment_done(db, first, queue, cache=cache)) == 2
    tick(db, campaign_id, queue, cache=cache)  # a sweep's tick: another full refresh
    assert assignment_done(db, second, queue, cache=cache) == []
    assert assignment_done(db, first, queue, cache=cache) == []
    assert len(ticks) == 1


def test_a_report_from_before_a_restart_records_the_best_without_a_tick(db, queue, monkeypatch):
    """A fresh planner (empty cache) ticked once; a report of an assignment closed before that tick
    is read from the DB for its best and changes nothing else."""
    import services.planner.campaign as campaign_module

    (problem,) = add_problems(db, 1)
    campaign_id = new_campaign(db, [problem], writers=1, per_assignment=1)
    (old,) = tick(db, campaign_id, queue)
    best = Attempts(db).add(problem, campaign_id, "PASSED", speedup=1.3, assignment_id=old)
    close(db, old)
    cache = StateCache()  # the planner restarted
    tick(db, campaign_id, queue, cache=cache)
    ticks = []
    real_tick = campaign_module.tick
    monkeypatch.setattr(campaign_module, "tick", lambda *a, **k: ticks.append(1) or real_tick(*a, **k))

    assert assignment_done(db, old, queue, cache=cache) == []
    assert ticks == [] and best_of(db, campaign_id, problem) == best

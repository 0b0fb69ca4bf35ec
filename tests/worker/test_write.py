"""run_assignment against a real SQLite DB and local store, with a hand-written evaluator."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from services.worker.write import assignment_closed, run_assignment
from shared.db import AssignmentRow, AttemptRow, CampaignRow, ProblemRow, SolutionRow, TraceRow, utcnow
from shared.repository import attempt_workloads, get_solution, problem_from_row, upsert_problem
from shared.runtime import Runtime
from shared.schema import load_problem
from shared.settings import Settings

PROBLEMS = Path(__file__).resolve().parents[2] / "problems"
RMSNORM = "llama31_8b_rmsnorm"  # CHUNK_ROWS [0, 16, 128] x FP32_WEIGHT [False, True]
OPTIMUM = {"CHUNK_ROWS": 128, "FP32_WEIGHT": True}

Values = dict[str, object]


def rmsnorm_speedup(values: Values) -> float:
    """Better with bigger chunks and with fp32 weights; the optimum is OPTIMUM at 2.5."""
    return 1.0 + values["CHUNK_ROWS"] / 128 + (0.5 if values["FP32_WEIGHT"] else 0.0)


def rmsnorm_fails(values: Values) -> bool:
    return values["CHUNK_ROWS"] == 16 and values["FP32_WEIGHT"]


class FakeEvaluator:
    """`send_evaluate` that gives its verdict at once, writing the attempt row and its traces as the
    evaluator does: only the workloads the attempt names, PARTIAL when those are not all of them.

    It reads the attempt from a fresh session, so it also checks that the row was committed first.
    `on_call` runs after each verdict (to stop a campaign mid-assignment, say). `latency_ms`, given
    the values and a workload's index, sets each workload's latency; by default 1 / speedup on all.
    """

    def __init__(self, runtime: Runtime, speedup: Callable[[Values], float] = rmsnorm_speedup,
                 fails: Callable[[Values], bool] = rmsnorm_fails,
                 on_call: Callable[[int], None] | None = None,
                 latency_ms: Callable[[Values, int], float] | None = None) -> None:
        self.runtime, self.speedup, self.fails, self.on_call = runtime, speedup, fails, on_call
        self.latency_ms = latency_ms or (lambda values, _index: 1.0 / self.speedup(values))
        self.calls: list[tuple[str, str]] = []

    def __call__(self, attempt_id: str, device: str) -> None:
        self.calls.append((attempt_id, device))
        with self.runtime.db.session() as session:
            attempt = session.get(AttemptRow, attempt_id)
            assert attempt is not None and attempt.status == "PENDING", "sent before the commit"
            chosen = get_solution(self.runtime.store, attempt.solution_hash).spec.tunable_values
            problem = problem_from_row(session.get(ProblemRow, attempt.problem_id))
            ran = attempt_workloads(problem, attempt.workload_uuids).workloads
            attempt.workloads_total = len(ran)
            if self.fails(chosen):
                attempt.status = "INCORRECT_NUMERICAL"
            else:
                partial = len(ran) < len(problem.workloads)
                attempt.status, attempt.workloads_passed = "PARTIAL" if partial else "PASSED", len(ran)
                attempt.speedup = self.speedup(chosen)
                attempt.latency_ms = 1.0 / attempt.speedup
                for workload in ran:
                    session.add(TraceRow(attempt_id=attempt_id, workload_uuid=workload.uuid, status="PASSED",
                                         latency_ms=self.latency_ms(chosen, problem.workloads.index(workload)),
                                         trace_json="{}"))
            attempt.finished_at = utcnow()
        if self.on_call is not None:
            self.on_call(len(self.calls))


class SilentEvaluator:
    """Accepts every attempt and never answers."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, attempt_id: str, device: str) -> None:
        self.calls.append(attempt_id)


@pytest.fixture
def runtime(tmp_path, request) -> Iterator[Runtime]:
    """Settings overridden by an indirect parametrization (`WALK`)."""
    overrides = getattr(request, "param", {})
    runtime = Runtime(Settings(home=tmp_path, problems_dir=PROBLEMS, attempt_wait_s=5.0, **overrides))
    yield runtime
    runtime.db.dispose()


# The tuner without successive halving: every attempt on every workload, the neighbour walk
# (tests/worker/test_write_halving.py has the writer with it).
WALK = pytest.mark.parametrize("runtime", [{"tuner_eta": 0}], indirect=True, ids=["no halving"])


@pytest.fixture
def problem_id(runtime) -> int:
    with runtime.db.session() as session:
        return upsert_problem(session, load_problem(PROBLEMS / RMSNORM)).id


def add_campaign(runtime: Runtime, device: str = "cpu") -> int:
    with runtime.db.session() as session:
        campaign = CampaignRow(name="c", device=device, status="RUNNING")
        session.add(campaign)
        session.flush()
        return campaign.id


def add_assignment(runtime: Runtime, campaign_id: int, problem_id: int, budget: int, **fields) -> int:
    with runtime.db.session() as session:
        row = AssignmentRow(campaign_id=campaign_id, problem_id=problem_id, budget_attempts=budget,
                            **{"status": "QUEUED", **fields})
        session.add(row)
        session.flush()
        return row.id


def attempts(runtime: Runtime, assignment_id: int | None = None) -> list[AttemptRow]:
    query = select(AttemptRow).order_by(AttemptRow.created_at)
    if assignment_id is not None:
        query = query.where(AttemptRow.assignment_id == assignment_id)
    with runtime.db.session() as session:
        return list(session.scalars(query))


def assignment(runtime: Runtime, assignment_id: int) -> AssignmentRow:
    with runtime.db.session() as session:
        return session.get(AssignmentRow, assignment_id)


def chosen(runtime: Runtime, attempt: AttemptRow) -> Values:
    return get_solution(runtime.store, attempt.solution_hash).spec.tunable_values


def test_makes_budget_attempts_each_a_new_solution_linked_to_its_assignment(runtime, problem_id):
    campaign_id = add_campaign(runtime, device="cpu")
    assignment_id = add_assignment(runtime, campaign_id, problem_id, budget=4)
    evaluator = FakeEvaluator(runtime)

    assert run_assignment(runtime, assignment_id, evaluator) == 4

    made = attempts(runtime)
    assert [a.id for a in made] == [attempt_id for attempt_id, _ in evaluator.calls]
    assert {device for _, device in evaluator.calls} == {"cpu"}
    assert len({a.solution_hash for a in made}) == 4
    for attempt in made:
        assert (attempt.campaign_id, attempt.assignment_id, attempt.problem_id) == (
            campaign_id, assignment_id, problem_id)
        assert attempt.device == "cpu"
    row = assignment(runtime, assignment_id)
    assert row.status == "DONE" and row.finished_at is not None and row.worker
    assert chosen(runtime, made[0]) == {"CHUNK_ROWS": 0, "FP32_WEIGHT": False}  # the seed first


def neighbours(combo: tuple[int, bool]) -> set[tuple[int, bool]]:
    rows, fp32 = combo
    return {(rows, not fp32)} | {(other, fp32) for other in (0, 16, 128) if other != rows}


@WALK
def test_walks_toward_the_best_and_stops_when_the_space_is_exhausted(runtime, problem_id):
    campaign_id = add_campaign(runtime)
    assignment_id = add_assignment(runtime, campaign_id, problem_id, budget=10)

    assert run_assignment(runtime, assignment_id, FakeEvaluator(runtime)) == 6  # the whole grid
    assert assignment(runtime, assignment_id).status == "DONE"

    made = attempts(runtime, assignment_id)
    with runtime.db.session() as session:
        parents = {row.hash: row.parent_hash for row in session.scalars(select(SolutionRow))}
    assert parents[made[0].solution_hash] is None
    best: AttemptRow | None = None
    done: set[tuple[int, bool]] = set()
    for attempt in made:
        values = chosen(runtime, attempt)
        combo = (values["CHUNK_ROWS"], values["FP32_WEIGHT"])
        if best is not None:
            best_values = chosen(runtime, best)
            open_neighbours = neighbours((best_values["CHUNK_ROWS"], best_values["FP32_WEIGHT"])) - done
            if open_neighbours:  # while the best has an untried neighbour, each step is one
                assert combo in open_neighbours
                assert parents[attempt.solution_hash] == best.solution_hash
        done.add(combo)
        if attempt.status == "PASSED" and (best is None or attempt.speedup > best.speedup):
            best = attempt
    assert chosen(runtime, best) == OPTIMUM
    assert [a.status for a in made].count("INCORRECT_NUMERICAL") == 1  # (16, True)


@WALK
def test_a_later_assignment_goes_on_where_the_last_one_stopped(runtime, problem_id):
    campaign_id = add_campaign(runtime)
    evaluator = FakeEvaluator(runtime)
    first = add_assignment(runtime, campaign_id, problem_id, budget=3)
    second = add_assignment(runtime, campaign_id, problem_id, budget=3)

    assert run_assignment(runtime, first, evaluator) == 3
    assert run_assignment(runtime, second, evaluator) == 3
    made = attempts(runtime)
    assert len({a.solution_hash for a in made}) == 6
    assert [a.assignment_id for a in made] == [first] * 3 + [second] * 3
    assert run_assignment(runtime, add_assignment(runtime, campaign_id, problem_id, budget=3), evaluator) == 0


def test_stops_when_the_campaign_is_stopped(runtime, problem_id):
    campaign_id = add_campaign(runtime)
    assignment_id = add_assignment(runtime, campaign_id, problem_id, budget=5)

    def stop_after_two(calls: int) -> None:
        if calls == 2:
            with runtime.db.session() as session:
                session.get(CampaignRow, campaign_id).status = "STOPPED"

    assert run_assignment(runtime, assignment_id, FakeEvaluator(runtime, on_call=stop_after_two)) == 2
    assert len(attempts(runtime)) == 2
    assert assignment(runtime, assignment_id).status == "DONE"


def test_a_stopped_campaign_gets_no_attempts(runtime, problem_id):
    campaign_id = add_campaign(runtime)
    assignment_id = add_assignment(runtime, campaign_id, problem_id, budget=5)
    with runtime.db.session() as session:
        session.get(CampaignRow, campaign_id).status = "STOPPED"
    evaluator = FakeEvaluator(runtime)

    assert run_assignment(runtime, assignment_id, evaluator) == 0
    assert evaluator.calls == [] and attempts(runtime) == []
    assert assignment(runtime, assignment_id).status == "CANCELLED"  # not "nothing left to try"
    assert assignment_closed(runtime, assignment_id)


def test_idempotent_a_done_assignment_does_nothing(runtime, problem_id):
    assignment_id = add_assignment(runtime, add_campaign(runtime), problem_id, budget=2)
    evaluator = FakeEvaluator(runtime)
    assert run_assignment(runtime, assignment_id, evaluator) == 2
    finished_at = assignment(runtime, assignment_id).finished_at

    assert run_assignment(runtime, assignment_id, evaluator) == 0
    assert len(evaluator.calls) == 2 and len(attempts(runtime)) == 2
    assert assignment(runtime, assignment_id).finished_at == finished_at


def test_an_unknown_assignment_does_nothing(runtime, problem_id):
    evaluator = FakeEvaluator(runtime)
    assert run_assignment(runtime, 404, evaluator) == 0
    assert evaluator.calls == []


def test_an_evaluator_that_never_answers_does_not_hang_the_writer(tmp_path):
    runtime = Runtime(Settings(home=tmp_path, problems_dir=PROBLEMS, attempt_wait_s=0.05))
    try:
        with runtime.db.session() as session:
            problem_id = upsert_problem(session, load_problem(PROBLEMS / RMSNORM)).id
        assignment_id = add_assignment(runtime, add_campaign(runtime), problem_id, budget=3)
        evaluator = SilentEvaluator()

        started = time.monotonic()
        assert run_assignment(runtime, assignment_id, evaluator) == 3
        assert time.monotonic() - started < 1.0  # three waits of 0.05 s, not three poll periods

        made = attempts(runtime)
        assert [a.id for a in made] == evaluator.calls
        assert {a.status for a in made} == {"PENDING"}
        assert len({a.solution_hash for a in made}) == 3  # an unanswered one is not proposed again
        assert assignment(runtime, assignment_id).status == "DONE"
    finally:
        runtime.db.dispose()


# --- the assignment protocol: claim, lease, budget on redelivery, brief ------------------------------


def test_a_duplicate_message_leaves_an_assignment_held_by_a_live_writer_alone(runtime, problem_id):
    assignment_id = add_assignment(runtime, add_campaign(runtime), problem_id, budget=3, status="RUNNING",
                                   worker="other/1/abc", lease_until=utcnow() + timedelta(minutes=5))
    evaluator = FakeEvaluator(runtime)

    assert run_assignment(runtime, assignment_id, evaluator) == 0
    assert evaluator.calls == []
    row = assignment(runtime, assignment_id)
    assert (row.status, row.worker) == ("RUNNING", "other/1/abc")
    assert not assignment_closed(runtime, assignment_id)  # so the task does not report it done


def test_a_redelivered_task_takes_over_and_counts_the_attempts_already_made(runtime, problem_id):
    campaign_id = add_campaign(runtime)
    evaluator = FakeEvaluator(runtime)
    assignment_id = add_assignment(runtime, campaign_id, problem_id, budget=5)
    # Long enough that the next call comes well inside it on a loaded machine (0.2 s was not, once,
    # with PostgreSQL on the 2-core VM: the second writer took over early).
    lease = 2.0
    calls = []

    def die_after_two(attempt_id: str, device: str) -> None:  # the first writer dies in its third call
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(attempt_id)
        evaluator(attempt_id, device)

    with pytest.raises(KeyboardInterrupt):
        run_assignment(runtime, assignment_id, die_after_two, lease_s=lease)
    assert assignment(runtime, assignment_id).status == "RUNNING"
    assert len(attempts(runtime, assignment_id)) == 3  # two evaluated, one recorded but never sent

    assert run_assignment(runtime, assignment_id, evaluator, lease_s=lease) == 0  # lease still held
    time.sleep(lease + 0.05)
    assert run_assignment(runtime, assignment_id, evaluator, lease_s=lease) == 2  # 5 less the 3 recorded

    made = attempts(runtime, assignment_id)
    assert len(made) == 5 and len({a.solution_hash for a in made}) == 5
    assert assignment(runtime, assignment_id).status == "DONE"


def test_the_lease_is_renewed_while_the_writer_works(runtime, problem_id):
    assignment_id = add_assignment(runtime, add_campaign(runtime), problem_id, budget=3)
    seen = []

    def slow(attempt_id: str, device: str) -> None:
        time.sleep(0.15)
        seen.append(assignment(runtime, assignment_id).lease_until)
        FakeEvaluator(runtime)(attempt_id, device)

    assert run_assignment(runtime, assignment_id, slow, lease_s=0.3) == 3
    assert seen == sorted(seen) and len(set(seen)) >= 2  # moved forward at least once
    assert assignment(runtime, assignment_id).lease_until is None  # a closed assignment holds no lease


def test_a_writer_whose_assignment_the_planner_expired_stops_and_leaves_it(runtime, problem_id):
    assignment_id = add_assignment(runtime, add_campaign(runtime), problem_id, budget=5)

    def expire_after_first(calls: int) -> None:
        if calls == 1:
            with runtime.db.session() as session:
                session.get(AssignmentRow, assignment_id).status = "EXPIRED"
            time.sleep(0.1)  # past the renewal time

    evaluator = FakeEvaluator(runtime, on_call=expire_after_first)
    assert run_assignment(runtime, assignment_id, evaluator, lease_s=0.2) == 1
    assert assignment(runtime, assignment_id).status == "EXPIRED"
    assert not assignment_closed(runtime, assignment_id)


@WALK
def test_a_parent_in_the_assignment_is_where_the_search_starts(runtime, problem_id):
    campaign_id = add_campaign(runtime)
    evaluator = FakeEvaluator(runtime)
    run_assignment(runtime, add_assignment(runtime, campaign_id, problem_id, budget=2), evaluator)
    first, second = attempts(runtime)
    parent = min((first, second), key=lambda a: a.speedup)  # not the best

    assignment_id = add_assignment(runtime, campaign_id, problem_id, budget=1, parent_hash=parent.solution_hash,
                                   language="pytorch", guidance="the last 2 attempts failed to compile: x")
    assert run_assignment(runtime, assignment_id, evaluator) == 1

    (child,) = attempts(runtime, assignment_id)
    with runtime.db.session() as session:
        assert session.get(SolutionRow, child.solution_hash).parent_hash == parent.solution_hash
    parent_values, child_values = chosen(runtime, parent), chosen(runtime, child)
    assert sum(parent_values[k] != child_values[k] for k in parent_values) == 1  # one tunable moved


def test_a_language_without_seeds_falls_back_on_every_seed(runtime, problem_id):
    assignment_id = add_assignment(runtime, add_campaign(runtime), problem_id, budget=1, language="cuda")
    assert run_assignment(runtime, assignment_id, FakeEvaluator(runtime)) == 1
    (made,) = attempts(runtime, assignment_id)
    assert chosen(runtime, made) == {"CHUNK_ROWS": 0, "FP32_WEIGHT": False}  # the pytorch seed


@WALK
def test_an_empty_assignment_is_done_not_cancelled(runtime, problem_id):
    """The search space is exhausted: DONE with no attempt, the planner's cue to retire the problem."""
    campaign_id = add_campaign(runtime)
    evaluator = FakeEvaluator(runtime)
    run_assignment(runtime, add_assignment(runtime, campaign_id, problem_id, budget=6), evaluator)
    assignment_id = add_assignment(runtime, campaign_id, problem_id, budget=2)

    assert run_assignment(runtime, assignment_id, evaluator) == 0
    assert assignment(runtime, assignment_id).status == "DONE"


class RacingSession:
    """Lets another writer record the same solution between this writer's check and its insert."""

    def __init__(self, session, runtime: Runtime) -> None:
        self._session, self._runtime = session, runtime

    def get(self, model, key):
        if model is SolutionRow:
            with self._runtime.db.session() as other:
                if other.get(SolutionRow, key) is None:
                    other.add(SolutionRow(hash=key, problem_id=1, name="twin", author="other writer",
                                          language="pytorch"))
            return None
        return self._session.get(model, key)

    def __getattr__(self, name):
        return getattr(self._session, name)


def test_a_solution_recorded_concurrently_by_another_writer_is_proposed_again(runtime, problem_id, monkeypatch):
    import services.worker.write as write

    real = write.put_solution
    raced = []

    def racing_put(session, store, *args, **kwargs):
        if not raced:
            raced.append(True)
            return real(RacingSession(session, runtime), store, *args, **kwargs)
        return real(session, store, *args, **kwargs)

    monkeypatch.setattr(write, "put_solution", racing_put)
    assignment_id = add_assignment(runtime, add_campaign(runtime), problem_id, budget=2)

    assert run_assignment(runtime, assignment_id, FakeEvaluator(runtime)) == 2
    assert raced and assignment(runtime, assignment_id).status == "DONE"


def test_a_writer_that_fails_gives_its_lease_up(runtime, problem_id):
    assignment_id = add_assignment(runtime, add_campaign(runtime), problem_id, budget=3)

    def broken(attempt_id: str, device: str) -> None:
        raise RuntimeError("broker down")

    with pytest.raises(RuntimeError):
        run_assignment(runtime, assignment_id, broken)
    row = assignment(runtime, assignment_id)
    assert row.status == "RUNNING" and row.lease_until <= utcnow()  # expired: a retry or the planner takes it
    assert run_assignment(runtime, assignment_id, FakeEvaluator(runtime)) == 2  # the retry: 3 less the 1 recorded

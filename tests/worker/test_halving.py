"""Successive halving on its own: the plan, the workloads of each rung, who is promoted, and that
the state read back from the records alone gives the same search, however often it is resumed."""

from __future__ import annotations

import pytest

from services.worker.halving import Measured, Rung, Step, next_step, rung_workloads, rungs, spread_order
from shared.schema import Solution

WORKLOADS = tuple(f"w{i}" for i in range(9))


def candidate(index: int) -> Solution:
    return Solution.model_validate({
        "name": f"c{index}", "definition": "synthetic", "author": "tests",
        "spec": {"languages": ["pytorch"], "target_hardware": ["CPU"], "entry_point": "main.py::run",
                 "tunables": {"I": list(range(64))}, "tunable_values": {"I": index}},
        "sources": [{"path": "main.py", "content": "def run(x, out):\n    out.copy_(x)\n"}]})


def index_of(solution: Solution) -> int:
    return solution.spec.tunable_values["I"]


class Simulated:
    """Records attempts as the evaluator would: latency(index, workload position); `fails` are out."""

    def __init__(self, latency=lambda i, w: 1.0 + i, fails: frozenset[int] = frozenset()) -> None:
        self.latency, self.fails = latency, fails
        self.records: list[Measured] = []

    def run(self, step: Step, workloads=WORKLOADS, finish: bool = True) -> Measured:
        ran = step.workloads if step.workloads is not None else workloads
        i = index_of(step.candidate)
        passed = i not in self.fails
        latency = {w: self.latency(i, workloads.index(w)) for w in ran} if passed and finish else {}
        record = Measured(f"a{len(self.records)}", step.candidate.content_hash(), frozenset(ran), finish, passed,
                          latency)
        self.records.append(record)
        return record


def run_to_the_end(candidates, evaluator: Simulated, workloads=WORKLOADS, eta: int = 3) -> tuple[list[Step], Step]:
    steps = []
    while (step := next_step(candidates, workloads, evaluator.records, eta)).candidate is not None:
        steps.append(step)
        evaluator.run(step, workloads)
        assert len(steps) < 500
    return steps, step


@pytest.mark.parametrize(("candidates", "workloads", "expected"), [
    (27, 27, [Rung(27, 3), Rung(9, 9), Rung(3, 27)]),  # 243 workload runs instead of 729
    (6, 6, [Rung(6, 2), Rung(2, 6)]),  # llama31_8b_rmsnorm's pytorch seed
    (9, 7, [Rung(9, 3), Rung(3, 7)]),
    (100, 2, [Rung(100, 1), Rung(34, 2)]),  # two workloads: two rungs at most
    (81, 81, [Rung(81, 3), Rung(27, 9), Rung(9, 27), Rung(3, 81)]),
    (2, 6, [Rung(2, 6)]),  # fewer than eta candidates: nothing to halve
    (500, 1, [Rung(500, 1)]),  # one workload: nothing to halve
    (1, 1, [Rung(1, 1)]),
    (0, 6, []),
])
def test_rung_sizes(candidates, workloads, expected):
    assert rungs(candidates, workloads) == expected


def test_eta_below_two_is_no_halving_and_other_etas_shrink_by_eta():
    assert rungs(27, 27, eta=1) == [Rung(27, 27)] and rungs(27, 27, eta=0) == [Rung(27, 27)]
    assert rungs(16, 16, eta=2) == [Rung(16, 2), Rung(8, 4), Rung(4, 8), Rung(2, 16)]
    for plan in (rungs(m, n, eta) for m in range(1, 60) for n in range(1, 40) for eta in (2, 3, 4)):
        assert plan[-1].workloads == max(r.workloads for r in plan)
        assert all(a.workloads < b.workloads and a.candidates > b.candidates for a, b in zip(plan, plan[1:]))
        assert len(plan) == 1 or plan[-1].candidates >= 2


def test_the_workloads_of_a_rung_are_spread_and_include_the_previous_rungs():
    assert spread_order(6) == [3, 0, 5, 1, 2, 4]
    assert spread_order(1) == [0] and spread_order(0) == []
    for n in range(1, 30):
        assert sorted(spread_order(n)) == list(range(n))
    assert rung_workloads(WORKLOADS, 1) == ("w4",)
    assert rung_workloads(WORKLOADS, 3) == ("w0", "w4", "w8")
    assert rung_workloads(WORKLOADS, 9) == WORKLOADS


def test_the_best_third_of_each_rung_is_promoted_and_the_last_rung_runs_everything():
    # Latency on a rung's workloads ranks 26 first, then 0, 25, 1, 24, ...: not the list's order.
    order = [26, 0, 25, 1, 24, 2, 23, 3, 22] + list(range(4, 22))
    candidates = [candidate(i) for i in range(27)]
    evaluator = Simulated(latency=lambda i, w: 1.0 + order.index(i) + 0.01 * w)
    steps, done = run_to_the_end(candidates, evaluator)

    by_rung = {r: [index_of(s.candidate) for s in steps if s.rung == r] for r in range(3)}
    assert by_rung[0] == list(range(27))  # everyone, in the candidates' order
    assert sorted(by_rung[1]) == sorted(order[:9])  # the best 27/3
    assert sorted(by_rung[2]) == sorted(order[:3])  # the best 9/3
    assert rungs(27, 9) == [Rung(27, 1), Rung(9, 3), Rung(3, 9)]
    assert {s.workloads for s in steps if s.rung == 0} == {("w4",)}
    assert {s.workloads for s in steps if s.rung == 1} == {("w0", "w4", "w8")}
    assert {s.workloads for s in steps if s.rung == 2} == {None}  # the last rung: every workload
    assert [index_of(c) for c in done.finalists] == order[:3]  # best first
    assert sum(len(s.workloads or WORKLOADS) for s in steps) == 27 * 1 + 9 * 3 + 3 * 9  # not 27 * 9


def test_a_candidate_that_fails_is_out_and_does_not_take_a_place():
    candidates = [candidate(i) for i in range(9)]  # 9 on 9 workloads: 9 on 3, then 3 on 9
    evaluator = Simulated(fails=frozenset({0, 1}))  # the two fastest fail
    steps, done = run_to_the_end(candidates, evaluator)
    assert [index_of(s.candidate) for s in steps if s.rung == 1] == [2, 3, 4]
    assert [index_of(c) for c in done.finalists] == [2, 3, 4]


def test_a_full_set_attempt_counts_on_every_rung_without_another_run():
    candidates = [candidate(i) for i in range(9)]
    evaluator = Simulated()
    evaluator.run(Step(0, candidates[0], None))  # the seed, as written, ran everything first
    steps, done = run_to_the_end(candidates, evaluator)
    assert 0 not in [index_of(s.candidate) for s in steps]
    assert [index_of(c) for c in done.finalists] == [0, 1, 2]


def test_resumed_from_the_records_after_every_step_the_search_is_the_same():
    """A writer that dies after any attempt leaves only its records; the next one reads them."""
    candidates = [candidate(i) for i in range(27)]
    latency = lambda i, w: 1.0 + (i * 7) % 27 + 0.1 * w  # noqa: E731
    reference = Simulated(latency)
    expected, _ = run_to_the_end(candidates, reference)
    for cut in (0, 1, 13, 27, 30, len(expected) - 1):
        resumed = Simulated(latency)
        resumed.records = list(reference.records[:cut])  # what the dead writer left
        steps, done = run_to_the_end(candidates, resumed)
        assert [(s.candidate.name, s.workloads) for s in steps] == [(s.candidate.name, s.workloads)
                                                                   for s in expected[cut:]]
    assert len({(s.candidate.name, s.rung) for s in expected}) == len(expected)  # nothing run twice


def test_a_rung_waits_for_its_attempts_in_flight_and_goes_on_once_they_finish():
    candidates = [candidate(i) for i in range(9)]
    evaluator = Simulated()
    pending = None
    for i in range(9):
        step = next_step(candidates, WORKLOADS, evaluator.records)
        assert step.rung == 0 and index_of(step.candidate) == i  # the in-flight one is not proposed again
        record = evaluator.run(step, finish=i != 4)
        pending = record if i == 4 else pending
    step = next_step(candidates, WORKLOADS, evaluator.records)
    assert step.candidate is None and step.waiting_on == (pending.attempt_id,) and not step.finalists

    evaluator.records[evaluator.records.index(pending)] = Measured(
        pending.attempt_id, pending.solution_hash, pending.workloads, True, True,
        {w: 0.5 for w in pending.workloads})  # the evaluator's verdict arrives: the fastest
    step = next_step(candidates, WORKLOADS, evaluator.records)
    assert step.rung == 1 and index_of(step.candidate) == 4


def test_nothing_to_halve_is_none_and_scores_are_geometric_means():
    assert next_step([candidate(0), candidate(1)], WORKLOADS, []) is None
    assert next_step([candidate(i) for i in range(9)], ("only",), []) is None
    candidates = [candidate(i) for i in range(9)]  # rung 0 runs w0, w4, w8
    # c1 is 100x faster than the others on w0 and 2x slower on w4 and w8: the best by geometric
    # mean (0.34 ms), the worst by arithmetic mean (1.34 ms).
    evaluator = Simulated(latency=lambda i, w: {0: 0.01, 4: 2.0, 8: 2.0}.get(w, 1.0) if i == 1 else 1.0)
    steps, _ = run_to_the_end(candidates, evaluator)
    assert [index_of(s.candidate) for s in steps if s.rung == 1] == [1, 0, 2]  # ties: the earlier first

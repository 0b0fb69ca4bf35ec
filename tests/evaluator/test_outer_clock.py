"""The outer clock without children: its allowance's arithmetic, what a window over it is charged
(`retime`), and its protocol over a real socket pair (the evaluator's side served in its thread,
the harness's side in the test), re-times included."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from services.evaluator.harness.clock import ClockLost, HarnessClock
from services.evaluator.harness.correctness import Check
from services.evaluator.outer_clock import (
    K_OVERHEAD, SLACK_MS, SPREAD, OuterClock, Window, accounted_ms, allowed_ms, forged, overhead_per_set_ms,
    timed_hand_over,
)
from services.evaluator.retime import Retimer, account, charged_ms
from shared.schema import Status

# The reference: a window of 10 ms over 5 timed sets, 5 ms of it its own calls: 1 ms per set.
REFERENCE = Window("w", 0.0, 0.010, runs=5, total_ms=5.0, median_ms=0.5)


def _candidate(window_ms: float, runs: int = 3, total_ms: float = 7.0, median_ms: float = 2.0) -> Window:
    return Window("w", 100.0, 100.0 + window_ms / 1e3, runs, total_ms, median_ms)


def _latency(window: Window) -> dict:
    return {"runs": window.runs, "median_ms": window.median_ms}


def test_the_reference_overhead_is_its_window_less_its_work_per_set() -> None:
    assert overhead_per_set_ms(REFERENCE) == pytest.approx(1.0)
    assert overhead_per_set_ms(Window("w", 0.0, 0.001, runs=2, total_ms=5.0)) == 0.0  # never negative


def test_what_the_report_accounts_for_is_held_at_spread_times_the_median() -> None:
    assert accounted_ms(_candidate(50.0)) == 7.0  # the sum of its samples, under 1.5 x 3 x 2 = 9
    clamped = _candidate(50.0, total_ms=900.0, median_ms=1.0)  # a made-up median, the time in "outliers"
    assert accounted_ms(clamped) == pytest.approx(SPREAD * 3 * 1.0)


def test_a_window_up_to_the_allowance_stands_and_beyond_it_is_charged_never_accused() -> None:
    sets = 5
    allowance = 7.0 + K_OVERHEAD * sets * 1.0 + SLACK_MS
    assert allowed_ms(_candidate(0.0), REFERENCE, sets) == pytest.approx(allowance)
    inside = _candidate(allowance - 0.5)
    stands = account(_latency(inside), [inside], REFERENCE, sets)
    assert not stands.charged and stands.latency_ms == inside.median_ms and stands.retimes == 0
    beyond = _candidate(allowance + 0.5)
    charged = account(_latency(beyond), [beyond], REFERENCE, sets)
    assert not isinstance(charged, str) and charged.charged
    # The window less the reference's overhead for the 5 sets (1 ms each), per run (3 runs).
    assert charged.latency_ms == pytest.approx((allowance + 0.5 - 5.0) / 3)
    assert charged.timing()["outer_charged_ms"] == pytest.approx(charged.latency_ms, abs=1e-6)
    assert stands.timing()["outer_charged_ms"] is None


def test_the_charge_is_never_below_the_reported_median_and_takes_the_best_batch() -> None:
    tight = _candidate(1.0, median_ms=2.0)  # a window shorter than what it reports: its own median stands
    assert charged_ms(tight, REFERENCE, 5) == 2.0
    first, again = _candidate(900.0), _candidate(600.0)
    charged = account(_latency(again), [first, again], REFERENCE, 5, slack_ms=-1000.0)
    assert charged.charged and charged.retimes == 1
    assert charged.latency_ms == pytest.approx((600.0 - 5.0) / 3)
    # A smaller slack is a smaller allowance: what fits with the default is over with -50 ms.
    inside = _candidate(allowed_ms(_candidate(0.0), REFERENCE, 5) - 10.0)
    assert not account(_latency(inside), [inside], REFERENCE, 5).charged
    assert account(_latency(inside), [inside], REFERENCE, 5, slack_ms=SLACK_MS - 50.0).charged


def test_a_charge_holds_the_time_hidden_from_the_timer() -> None:
    """A batch that reports 0.01 ms a run and spent 300 ms per run out of its timer's sight is
    charged at least the hidden time."""
    hidden = Window("w", 0.0, 0.9 + 0.005, runs=3, total_ms=0.03, median_ms=0.01)
    assert account({"runs": 3, "median_ms": 0.01}, [hidden], REFERENCE, 5).latency_ms >= 300.0 - 5.0 / 3


def test_a_report_without_its_window_or_unlike_it_is_forged() -> None:
    window = _candidate(20.0)
    assert "never saw begin and end" in forged(_latency(window), None)
    unended = Window("w", 100.0)
    assert "never saw begin and end" in forged(_latency(window), unended)
    assert "differ" in forged({"runs": 3, "median_ms": 1.0}, window)
    assert "differ" in forged({"runs": 2, "median_ms": 2.0}, window)
    assert "never saw begin and end" in account(_latency(window), [], REFERENCE, 5)
    # A re-time opened (`again`) and never ended: the result of the batch before it is forged.
    assert "never saw begin and end" in account(_latency(window), [window], REFERENCE, 5, last=Window("w", 200.0))


class _Served:
    """An OuterClock serving one end of a socket pair; the test plays the harness on the other."""

    def __init__(self, uuids: list[str], hand_over=lambda uuid: {"set_seeds": [7, 8]}, seal=None) -> None:
        ours, theirs = socket.socketpair()
        self.clock = OuterClock(ours, uuids, hand_over, seal)
        self.harness = HarnessClock(os.dup(theirs.fileno()))
        theirs.close()
        self.clock.start()

    def send(self, **message) -> None:
        self.harness._socket.sendall(json.dumps(message).encode() + b"\n")

    def stop(self) -> OuterClock:
        self.harness._socket.close()
        self.clock.stop()
        return self.clock


def test_the_handshake_in_order_opens_and_closes_a_window_per_workload() -> None:
    served = _Served(["a", "b", "c"])
    assert served.harness.ready("a") == {"op": "go", "set_seeds": [7, 8]}
    served.harness.end("a", 3, 0.3, 0.1)
    served.harness.ready("b")  # b's batch failed before its end: c may still follow
    served.harness.ready("c")
    served.harness.end("c", 2, 0.2, 0.1)
    clock = served.stop()
    assert clock.violation is None
    a, b, c = (clock.windows[u] for u in "abc")
    assert (a.runs, a.total_ms, a.median_ms) == (3, 0.3, 0.1) and a.end_s >= a.begin_s
    assert b.end_s is None and c.end_s is not None


@pytest.mark.parametrize("messages, why", [
    ([{"op": "end", "uuid": "a", "runs": 1, "total_ms": 1, "median_ms": 1}], "without its `ready`"),
    ([{"op": "ready", "uuid": "b"}, {"op": "ready", "uuid": "a"}], "out of order"),
    ([{"op": "ready", "uuid": "a"}, {"op": "ready", "uuid": "a"}], "out of order"),
    ([{"op": "ready", "uuid": "z"}], "out of order"),
    ([{"op": "ready", "uuid": "a"}, {"op": "end", "uuid": "b", "runs": 1, "total_ms": 1, "median_ms": 1}],
     "without its `ready`"),
    ([{"op": "ready", "uuid": "a"}, {"op": "end", "uuid": "a", "runs": "x", "total_ms": 1, "median_ms": 1}],
     "cannot read"),
    ([{"op": "begin", "uuid": "a"}], "unknown message"),
])
def test_a_broken_protocol_is_a_violation_and_closes_the_channel(messages: list[dict], why: str) -> None:
    served = _Served(["a", "b"])
    for message in messages:
        served.send(**message)
    served.clock._thread.join(timeout=10)
    assert why in (served.clock.violation or "")
    served.stop()


def test_garbage_and_overlong_lines_are_violations() -> None:
    from services.evaluator.protocol import MAX_CHILD_LINE as MAX_LINE

    for line in (b"not json\n", b"x" * (MAX_LINE + 1)):
        served = _Served(["a"])
        served.harness._socket.sendall(line)
        served.clock._thread.join(timeout=10)
        assert "not the protocol's" in (served.clock.violation or "")
        served.stop()


def test_after_a_violation_the_harness_gets_no_go() -> None:
    served = _Served(["a"])
    served.send(op="end", uuid="a", runs=1, total_ms=1.0, median_ms=1.0)
    with pytest.raises(ClockLost):
        served.harness.ready("a")
    served.stop()


def test_timed_files_that_cannot_be_handed_over_are_a_violation() -> None:
    def gone(uuid: str) -> dict:
        raise FileNotFoundError("w0_s2.st")

    served = _Served(["a"], gone)
    with pytest.raises(ClockLost):
        served.harness.ready("a")
    assert "could not be handed over" in served.stop().violation


def test_the_hand_over_gives_the_timed_seeds_or_moves_the_timed_files(tmp_path: Path) -> None:
    timed, inputs = tmp_path / ".t", tmp_path / "inputs"
    timed.mkdir(mode=0o700)
    inputs.mkdir()
    for s in (2, 3):
        (timed / f"w1_s{s}.st").write_bytes(b"set")
    hand_over = timed_hand_over(timed, inputs, 2, {
        "seeded": (0, {"timed_sets": 2, "set_seeds": [1, 2, 3, 4], "set_digests": ["d1", "d2", "d3", "d4"]}),
        "files": (1, {"timed_sets": 2}),
    })
    assert hand_over("seeded") == {"set_seeds": [3, 4], "set_digests": ["d3", "d4"]}
    assert sorted(p.name for p in inputs.iterdir()) == []
    assert hand_over("files") == {"set_seeds": None}
    assert sorted(p.name for p in inputs.iterdir()) == ["w1_s2.st", "w1_s3.st"] and not list(timed.iterdir())


def test_a_check_reads_the_outputs_as_they_are_when_it_runs(tmp_path: Path) -> None:
    """What the checker reads at `end` (`checks.read_regular`): a copy taken then; later writes,
    through the path or a descriptor opened before, change nothing; what is not a regular file of
    at most its limit (a link, a pipe that would block the read, an oversized file) has no copy."""
    from services.evaluator.harness.checks import Oversized, read_regular

    (tmp_path / "w3_s2.st").write_bytes(b"at end")
    early = open(tmp_path / "w3_s3.st", "wb")  # opened before `end`, written after it
    early.write(b"x" * 10)
    early.flush()
    copies = [read_regular(tmp_path / name, 10) for name in ("w3_s2.st", "w3_s3.st")]
    (tmp_path / "w3_s2.st").write_bytes(b"afterwards")
    early.seek(0)
    early.write(b"y" * 10)
    early.close()
    assert copies == [b"at end", b"x" * 10]

    (tmp_path / "w4_s2.st").symlink_to(tmp_path / "w3_s2.st")
    os.mkfifo(tmp_path / "w4_s3.st")
    assert [read_regular(tmp_path / n, 10) for n in ("w4_s2.st", "w4_s3.st", "w4_s4.st")] == [None, None, None]
    (tmp_path / "big.st").write_bytes((16).to_bytes(8, "little") + b"h" * 16 + b"z" * 100)
    assert read_regular(tmp_path / "big.st", 10) == Oversized((16).to_bytes(8, "little") + b"h" * 16)


def test_an_oversized_timed_output_is_judged_by_its_header(tmp_path: Path) -> None:
    """Larger than the expected outputs allow: the header says what it got wrong (a dtype here,
    INCORRECT_DTYPE as a file read whole would say), and right outputs padded with more bytes are
    a hack (the harness writes nothing else)."""
    import torch

    from services.evaluator.harness import tensorfile
    from services.evaluator.harness.checks import check_sets
    from evalkit import affine_definition, affine_workloads, make_problem

    problem = make_problem(tmp_path / "p", affine_definition(), affine_workloads())
    workload = problem.workloads[0]
    y = torch.ones(workload.axes["n"], 16)
    expected = {f"w0_s{s}": {"y": y} for s in range(2)}
    outputs = tmp_path / "out"
    outputs.mkdir()
    tensorfile.save({"y": y}, outputs / "w0_s0.st")  # the correctness round: right
    big = torch.zeros(2 << 20)  # beyond the limit: the expected outputs' bytes and 1 MiB
    for timed, status in (({"y": y.double(), "pad": big}, "INCORRECT_DTYPE"), ({"y": y, "pad": big}, "REWARD_HACK")):
        expected["w0_s1"] = {"y": y}
        tensorfile.save(timed, outputs / "w0_s1.st")
        check = check_sets(problem.definition, workload.effective_tolerance, 0, 1, 1, outputs, expected,
                           torch.device("cpu"))
        assert check.status.value == status, check.message
        assert "timed run on input set 1" in check.message


def test_a_missing_set_is_named_for_the_evaluator(tmp_path: Path) -> None:
    import torch

    from services.evaluator.harness import tensorfile
    from services.evaluator.harness.checks import check_sets
    from evalkit import affine_definition, affine_workloads, make_problem

    problem = make_problem(tmp_path / "p", affine_definition(), affine_workloads())
    workload = problem.workloads[0]
    y = torch.ones(workload.axes["n"], 16)
    tensorfile.save({"y": y}, tmp_path / "w0_s0.st")
    check = check_sets(problem.definition, workload.effective_tolerance, 0, 1, 1, tmp_path,
                       {"w0_s0": {"y": y}, "w0_s1": {"y": y}}, torch.device("cpu"))
    assert check.status.value == "RUNTIME_ERROR" and check.missing == 1


def test_checking_is_taken_only_from_the_checkers_channel() -> None:
    """The reference's `checking` hands its channel over; from the candidate it breaks the protocol."""
    for checker, violation in ((True, False), (False, True)):
        ours, theirs = socket.socketpair()
        clock = OuterClock(ours, ["a"], lambda uuid: {}, checker=checker)
        clock.start()
        theirs.sendall(b'{"op": "checking", "uuid": ""}\n')
        clock.join()
        assert clock.checking.is_set() is checker and (clock.violation is not None) is violation
        ours.close()
        theirs.close()


def test_the_seal_runs_at_end_and_not_before(tmp_path: Path) -> None:
    sealed = []
    served = _Served(["a"], seal=lambda uuid, runs, shared: sealed.append((uuid, runs)))
    served.harness.ready("a")
    assert sealed == []
    served.harness.end("a", 3, 3.0, 1.0)
    deadline = time.monotonic() + 10
    while not sealed and time.monotonic() < deadline:
        time.sleep(0.01)
    served.stop()
    assert sealed == [("a", 3)] and served.clock.windows["a"].end_s is not None


def test_an_end_with_shared_sets_waits_for_sealed_until_the_check_is_done() -> None:
    """Output sets shared in GPU memory (`gpu_handover`): the harness's `end` returns only after the
    evaluator's seal (the checker's copies) has returned, so it cannot let them go before."""
    order: list[str] = []

    def seal(uuid, runs, shared):
        time.sleep(0.2)  # the checker copying
        order.append(f"sealed {uuid} {runs} {sorted(shared)}")

    served = _Served(["a"], seal=seal)
    served.harness.ready("a")
    served.harness.end("a", 2, 2.0, 1.0, {2: {"tensors": {}}, 3: {"tensors": {}}})
    order.append("end returned")
    clock = served.stop()
    assert clock.violation is None
    assert order == ["sealed a 2 ['2', '3']", "end returned"]


def test_shared_sets_the_evaluator_cannot_read_are_a_violation() -> None:
    served = _Served(["a"], seal=lambda uuid, runs, shared: None)
    served.harness.ready("a")
    served.send(op="end", uuid="a", runs=1, total_ms=1.0, median_ms=1.0, shared=[1, 2])
    served.clock._thread.join(timeout=10)
    assert "shared output sets" in (served.clock.violation or "")
    served.stop()


def test_an_end_that_gets_no_sealed_loses_the_clock() -> None:
    served = _Served(["a"], seal=lambda uuid, runs, shared: None)
    served.harness.ready("a")
    served.clock.channel.shutdown(socket.SHUT_WR)  # the evaluator gone before it answered
    with pytest.raises(ClockLost):
        served.harness.end("a", 1, 1.0, 1.0, {2: {}})
    served.stop()


def test_an_end_over_its_allowance_is_answered_again_and_opens_a_new_window() -> None:
    """`again` carries the fresh sets; the batch re-timed has its own window; a later `end`
    answered `sealed` closes the workload. Every closed window is kept, in order."""
    answers = iter([{"first": 5, "set_seeds": [9, 10, 11], "set_digests": ["a", "b", "c"]}, None])
    sealed = []
    ours, theirs = socket.socketpair()
    clock = OuterClock(ours, ["a"], lambda uuid: {"set_seeds": [7, 8, 9]},
                       seal=lambda uuid, runs, shared: sealed.append(runs), retime=lambda uuid, window: next(answers))
    harness = HarnessClock(os.dup(theirs.fileno()))
    theirs.close()
    clock.start()
    harness.ready("a")
    again = harness.end("a", 3, 3.0, 1.0)
    assert again == {"op": "again", "first": 5, "set_seeds": [9, 10, 11], "set_digests": ["a", "b", "c"]}
    assert clock.windows["a"].end_s is None  # open again
    assert harness.end("a", 2, 2.0, 0.9) is None
    harness._socket.close()
    clock.stop()
    assert clock.violation is None and sealed == [3, 2]
    first, second = clock.batches["a"]
    assert (first.runs, second.runs) == (3, 2) and second.begin_s >= first.end_s
    assert clock.windows["a"] is second


class _Fresh:
    """The checker's `more`, recorded."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, int, int]] = []

    def __call__(self, index: int, first: int, count: int) -> dict:
        self.asked.append((index, first, count))
        return {"set_seeds": list(range(first, first + count)), "set_digests": ["d"] * count}


def test_the_retimer_asks_fresh_sets_after_every_earlier_batch_up_to_its_limit() -> None:
    fresh, verdicts = _Fresh(), {0: Check(Status.PASSED)}
    retimer = Retimer({"w": REFERENCE}, {"w": (0, {"timed_sets": 3})}, 2, 2, SLACK_MS, fresh, verdicts.get)
    over, inside = _candidate(10_000.0), _candidate(1.0)
    assert retimer.first_set("w") == 2
    assert retimer("w", over) == {"first": 5, "set_seeds": [5, 6, 7], "set_digests": ["d"] * 3}
    assert retimer.first_set("w") == 5
    assert retimer("w", over)["first"] == 8
    assert retimer("w", over) is None  # its limit: charged
    assert fresh.asked == [(0, 5, 3), (0, 8, 3)] and retimer.count["w"] == 2
    assert retimer("w", inside) is None and len(retimer.load["w"]) == 3


def test_the_retimer_leaves_failed_outputs_and_fitting_windows_alone() -> None:
    fresh = _Fresh()
    wrong = Retimer({"w": REFERENCE}, {"w": (0, {"timed_sets": 3})}, 2, 3, SLACK_MS, fresh,
                    {0: Check(Status.INCORRECT_NUMERICAL)}.get)
    assert wrong("w", _candidate(10_000.0)) is None
    fits = Retimer({"w": REFERENCE}, {"w": (0, {"timed_sets": 3})}, 2, 3, SLACK_MS, fresh,
                   {0: Check(Status.PASSED)}.get)
    assert fits("w", _candidate(1.0)) is None
    assert fresh.asked == []

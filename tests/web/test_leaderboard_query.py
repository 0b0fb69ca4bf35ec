"""shared.leaderboard: best selection, status, ordering, campaign scope and query count."""

from __future__ import annotations

import math
from datetime import timezone

import pytest
from rich.console import Console
from sqlalchemy import event

from shared.errors import NotFoundError
from shared.leaderboard import leaderboard, problem_figures, render_table


def board_of(db, campaign_id=None):
    with db.session() as session:
        return leaderboard(session, campaign_id)


def by_name(board):
    return {entry.name: entry for entry in board.problems}


def test_faster_passed_attempt_is_best_and_failures_never_count(db, seed):
    p = seed.problem("softmax", op_type="softmax")
    seed.attempt(p, "PASSED", speedup=1.5, latency_ms=2.0, minute=1, language="pytorch", author="alice")
    fast = seed.attempt(p, "PASSED", speedup=2.5, latency_ms=1.2, minute=2, language="triton", author="bob")
    seed.attempt(p, "INCORRECT_NUMERICAL", speedup=40.0, latency_ms=0.05, minute=3)
    seed.attempt(p, "REWARD_HACK", speedup=100.0, latency_ms=0.01, minute=4)
    seed.attempt(p, "RUNNING", speedup=500.0, latency_ms=0.001, minute=5)

    entry = by_name(board_of(db))["softmax"]

    assert entry.best_attempt_id == fast
    assert (entry.speedup, entry.best_latency_ms) == (2.5, 1.2)
    assert (entry.language, entry.author) == ("triton", "bob")
    assert entry.op_type == "softmax"
    assert entry.status == "PASSED"  # although the latest finished attempt is a REWARD_HACK
    assert (entry.attempts, entry.passed_attempts) == (4, 2)  # the RUNNING one is not finished
    assert entry.last_attempt_at is not None
    assert entry.last_attempt_at.tzinfo is not None
    assert entry.last_attempt_at.astimezone(timezone.utc).minute == 4


def test_speedup_ties_go_to_lower_latency_then_earlier(db, seed):
    p = seed.problem("gemm")
    seed.attempt(p, "PASSED", speedup=2.0, latency_ms=1.5, minute=1)
    earlier = seed.attempt(p, "PASSED", speedup=2.0, latency_ms=1.0, minute=2)
    seed.attempt(p, "PASSED", speedup=2.0, latency_ms=1.0, minute=3)

    assert by_name(board_of(db))["gemm"].best_attempt_id == earlier


def test_status_falls_back_to_latest_finished_attempt(db, seed):
    failing = seed.problem("failing")
    seed.attempt(failing, "COMPILE_ERROR", minute=1)
    seed.attempt(failing, "TIMEOUT", minute=5)
    seed.attempt(failing, "RUNTIME_ERROR", minute=3)
    seed.attempt(failing, "PENDING", minute=9)
    seed.problem("untouched")
    pending_only = seed.problem("pending-only")
    seed.attempt(pending_only, "PENDING", minute=1)

    entries = by_name(board_of(db))

    assert entries["failing"].status == "TIMEOUT"
    assert (entries["failing"].attempts, entries["failing"].passed_attempts) == (3, 0)
    assert entries["failing"].best_attempt_id is None
    assert entries["failing"].speedup is None
    for name in ("untouched", "pending-only"):
        assert entries[name].status == "NO_ATTEMPTS"
        assert entries[name].attempts == 0
        assert entries[name].last_attempt_at is None


def test_sorted_by_speedup_then_unsolved_by_name(db, seed):
    seed.attempt(seed.problem("alpha"), "PASSED", speedup=2.0, latency_ms=1.0)
    seed.attempt(seed.problem("zeta"), "PASSED", speedup=3.0, latency_ms=1.0)
    seed.attempt(seed.problem("mid"), "PASSED", speedup=0.5, latency_ms=1.0)
    seed.attempt(seed.problem("beta"), "INCORRECT_SHAPE", speedup=9.0)
    seed.problem("aardvark")

    assert [e.name for e in board_of(db).problems] == ["zeta", "alpha", "mid", "aardvark", "beta"]


def test_campaign_scope_limits_problems_and_attempts(db, seed):
    p1, p2, p3 = seed.problem("p1"), seed.problem("p2"), seed.problem("p3")
    campaign = seed.campaign([p1, p2])
    other = seed.campaign([p1, p3])
    mine = seed.attempt(p1, "PASSED", speedup=1.5, latency_ms=1.0, campaign_id=campaign, minute=1)
    theirs = seed.attempt(p1, "PASSED", speedup=5.0, latency_ms=0.3, campaign_id=other, minute=2)
    seed.attempt(p1, "PASSED", speedup=9.0, latency_ms=0.1, minute=3)  # outside any campaign
    seed.attempt(p2, "TIMEOUT", campaign_id=campaign, minute=1)
    seed.attempt(p2, "PASSED", speedup=2.0, latency_ms=1.0, campaign_id=other, minute=2)

    board = board_of(db, campaign)

    assert board.campaign_id == campaign
    assert [e.name for e in board.problems] == ["p1", "p2"]
    entries = by_name(board)
    assert entries["p1"].best_attempt_id == mine
    assert entries["p1"].attempts == 1
    assert (entries["p2"].status, entries["p2"].attempts) == ("TIMEOUT", 1)

    everything = by_name(board_of(db))
    assert set(everything) == {"p1", "p2", "p3"}
    assert everything["p1"].speedup == 9.0
    assert everything["p1"].attempts == 3
    assert by_name(board_of(db, other))["p1"].best_attempt_id == theirs


def test_unknown_campaign_is_not_found(db, seed):
    seed.problem("p1")
    with pytest.raises(NotFoundError):
        board_of(db, 42)


def test_query_count_does_not_grow_with_problems_or_attempts(db, seed):
    for i in range(15):
        p = seed.problem(f"p{i:02d}")
        for minute in range(4):
            seed.attempt(p, "PASSED" if minute % 2 else "RUNTIME_ERROR", speedup=1.0 + i + minute,
                         latency_ms=1.0, minute=minute)
    statements = []
    event.listen(db.engine, "before_cursor_execute", lambda *args: statements.append(args[2]))

    board = board_of(db)

    assert len(board.problems) == 15
    assert board.problems[0].name == "p14"
    assert board.problems[0].speedup == 1.0 + 14 + 3
    assert len(statements) <= 5


def test_summary_counts_solved_and_geomean(db, seed):
    seed.attempt(seed.problem("a"), "PASSED", speedup=4.0, latency_ms=1.0)
    seed.attempt(seed.problem("b"), "PASSED", speedup=1.0, latency_ms=1.0)
    seed.attempt(seed.problem("c"), "COMPILE_ERROR")
    seed.problem("d")

    summary = board_of(db).summary

    assert (summary.problems, summary.solved) == (4, 2)
    assert summary.geomean_speedup == pytest.approx(2.0)
    assert summary.beating_reference == pytest.approx(0.25)
    assert summary.above_2x == pytest.approx(0.25)


def test_a_problem_whose_only_pass_is_its_reference_is_not_solved(db, seed):
    """The reference's check on submission (a `pytorch` solution by `reference`) passing solves nothing."""
    only_reference = seed.problem("only_reference")
    seed.attempt(only_reference, "PASSED", speedup=1.0, latency_ms=1.0, language="pytorch", author="reference")
    also_a_writer = seed.problem("also_a_writer")
    seed.attempt(also_a_writer, "PASSED", speedup=1.0, latency_ms=1.0, language="pytorch", author="reference")
    seed.attempt(also_a_writer, "PASSED", speedup=0.9, latency_ms=1.1, author="kernelswarm-tuner")  # slower

    board = board_of(db)
    entries = by_name(board)

    assert not entries["only_reference"].solved and entries["also_a_writer"].solved
    assert entries["only_reference"].status == "PASSED" and entries["only_reference"].passed_attempts == 1
    assert (board.summary.problems, board.summary.solved) == (2, 1)


def test_render_table_has_a_row_per_problem(db, seed):
    seed.attempt(seed.problem("rmsnorm"), "PASSED", speedup=3.25, latency_ms=0.5, language="cuda")
    seed.attempt(seed.problem("topk"), "TIMEOUT")

    table = render_table(board_of(db))
    console = Console(width=200, record=True, color_system=None)
    console.print(table)
    text = console.export_text()

    assert table.row_count == 2
    assert "rmsnorm" in text and "3.25x" in text and "PASSED" in text
    assert "topk" in text and "TIMEOUT" in text
    assert text.index("rmsnorm") < text.index("topk")


def test_render_table_shows_the_model_or_a_dash_and_the_author_apart(db, seed):
    seed.attempt(seed.problem("by_llm"), "PASSED", speedup=3.0, author="llm-writer", model="gpt-oss-120b")
    seed.attempt(seed.problem("by_tuner"), "PASSED", speedup=2.0, author="kernelswarm-tuner")  # no model

    columns = {column.header: list(column.cells) for column in render_table(board_of(db)).columns}

    assert columns["problem"] == ["by_llm", "by_tuner"]
    assert columns["model"] == ["gpt-oss-120b", "—"]
    assert columns["author"] == ["llm-writer", "kernelswarm-tuner"]


def test_passed_without_speedup_ranks_after_speedups_but_before_unsolved(db, seed):
    seed.attempt(seed.problem("zz-no-reference"), "PASSED", speedup=None, latency_ms=1.0)
    seed.attempt(seed.problem("mm-fast"), "PASSED", speedup=0.9, latency_ms=1.0)
    seed.attempt(seed.problem("aa-failed"), "TIMEOUT")

    assert [e.name for e in board_of(db).problems] == ["mm-fast", "zz-no-reference", "aa-failed"]


def test_sol_score_decides_the_best_before_speedup(db, seed):
    p = seed.problem("rmsnorm")
    seed.attempt(p, "PASSED", speedup=3.0, latency_ms=1.0, sol_score=0.6, minute=1)
    closer = seed.attempt(p, "PASSED", speedup=2.5, latency_ms=1.2, sol_score=0.8, minute=2, model="gpt-oss-120b")
    seed.attempt(p, "PASSED", speedup=9.0, latency_ms=0.3, sol_score=None, minute=3)  # not scored yet

    entry = by_name(board_of(db))["rmsnorm"]

    assert entry.best_attempt_id == closer
    assert (entry.sol_score, entry.speedup, entry.model) == (0.8, 2.5, "gpt-oss-120b")
    assert entry.last_improvement_at.minute == 2
    assert entry.last_attempt_at.minute == 3


def test_speedup_over_baseline_is_the_geomean_over_workloads(db, seed):
    p = seed.problem("gemm", hf_id="meta-llama/Llama-3.1-8B")
    best = seed.attempt(p, "PASSED", speedup=2.0, latency_ms=1.0, sol_score=0.7)
    seed.trace(best, "w1", latency_ms=1.0, t_baseline_ms=2.0)
    seed.trace(best, "w2", latency_ms=1.0, t_baseline_ms=8.0)
    seed.trace(best, "w3", latency_ms=1.0, t_baseline_ms=None)  # not measured: left out
    unscored = seed.attempt(seed.problem("softmax"), "PASSED", speedup=1.5, latency_ms=1.0)
    seed.trace(unscored, "w1", latency_ms=1.0)

    entries = by_name(board_of(db))

    assert entries["gemm"].speedup_over_baseline == pytest.approx(4.0)
    assert entries["gemm"].source_model == "meta-llama/Llama-3.1-8B"
    assert entries["softmax"].speedup_over_baseline is None
    assert entries["softmax"].source_model is None


def test_summary_has_the_campaign_figures(db, seed):
    a, b, c = seed.problem("a"), seed.problem("b"), seed.problem("c")
    seed.problem("d")
    for problem, over_baseline, score in ((a, 4.0, 0.9), (b, 1.0, 0.5), (c, 0.5, 0.2)):
        attempt = seed.attempt(problem, "PASSED", speedup=over_baseline * 1.2, latency_ms=1.0, sol_score=score,
                               tokens=1000, gpu_seconds=1800.0)
        seed.trace(attempt, "w", latency_ms=1.0, t_baseline_ms=over_baseline)
    seed.attempt(a, "COMPILE_ERROR", tokens=500, gpu_seconds=1800.0)

    summary = board_of(db).summary

    assert summary.geomean_speedup_over_baseline == pytest.approx(math.exp((math.log(4) + math.log(0.5)) / 3))
    assert summary.beating_baseline == pytest.approx(0.25)  # a only: b ties T_b, d has nothing
    assert summary.above_2x_baseline == pytest.approx(0.25)
    assert summary.median_sol_score == pytest.approx(0.5)
    assert (summary.attempts, summary.tokens) == (4, 3500)
    assert summary.gpu_hours == pytest.approx(2.0)
    assert summary.geomean_speedup == pytest.approx(math.exp((math.log(4.8) + math.log(1.2) + math.log(0.6)) / 3))
    assert (summary.baseline_problems, summary.speedup_problems) == (3, 3)  # d has no figure


def test_empty_db_has_an_empty_summary(db):
    summary = board_of(db).summary

    assert (summary.problems, summary.solved, summary.attempts) == (0, 0, 0)
    assert summary.median_sol_score is None and summary.geomean_speedup_over_baseline is None
    assert summary.beating_baseline is None and summary.above_2x_baseline is None  # no T_b: no share
    assert (summary.baseline_problems, summary.speedup_problems) == (0, 0)


def test_without_any_baseline_the_shares_over_it_are_unknown_not_zero(db, seed):
    """A CPU run measures no T_b: "0% beating T_b" would say every problem was slower than it."""
    problem = seed.problem("cpu-only")
    attempt = seed.attempt(problem, "PASSED", speedup=1.5, latency_ms=1.0)
    seed.trace(attempt, "w", latency_ms=1.0, reference_latency_ms=1.5)

    summary = board_of(db).summary

    assert summary.beating_baseline is None and summary.baseline_problems == 0
    assert summary.speedup_problems == 1 and summary.beating_reference == 1.0


def test_figures_of_some_problems_equal_those_of_the_whole_board(db, seed):
    ids = [seed.problem(f"p{i}") for i in range(4)]
    for i, problem_id in enumerate(ids):
        seed.attempt(problem_id, "PASSED", speedup=1.0 + i, latency_ms=1.0, sol_score=0.1 * i, minute=i)
        seed.attempt(problem_id, "TIMEOUT", minute=10 + i, tokens=7)
    campaign = seed.campaign(ids[:2])
    seed.attempt(ids[1], "RUNTIME_ERROR", campaign_id=campaign)

    for campaign_id in (None, campaign):
        with db.session() as session:
            everything = problem_figures(session, campaign_id)
            some = problem_figures(session, campaign_id, [ids[1], ids[3]])
        assert some == {problem_id: everything[problem_id] for problem_id in (ids[1], ids[3])}
    assert some[ids[3]].status == "NO_ATTEMPTS"  # outside the campaign: none of its attempts count

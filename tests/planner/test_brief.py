"""What an assignment tells its writer: language, parent and guidance from recent failures."""

from __future__ import annotations

from services.planner.brief import Candidate, Recent, default_language, guidance, parent_for


def failed(status: str, message: str | None = None) -> Recent:
    return Recent(status, message)


PASSED = Recent("PASSED", None)


def test_the_same_failure_repeated_is_named_with_the_first_line_of_its_error():
    recent = [failed("COMPILE_ERROR", "\n  main.cu(12): error: identifier \"x\" is undefined\n  more\n")] * 5
    assert guidance(recent, stall=5) == (
        'the last 5 attempts failed to compile: main.cu(12): error: identifier "x" is undefined')


def test_the_streak_counts_only_the_latest_run_of_one_status():
    recent = [failed("TIMEOUT"), failed("TIMEOUT", "killed after 300 s"), failed("COMPILE_ERROR"), PASSED]
    assert guidance(recent, stall=3) == "the last 2 attempts timed out"


def test_mixed_failures_are_broken_down():
    recent = [failed("INCORRECT_NUMERICAL", "output `y`: 12 of 4096 elements off"), PASSED,
              failed("COMPILE_ERROR", "syntax"), failed("INCORRECT_NUMERICAL")]
    assert guidance(recent, stall=1) == (
        "3 of the last 4 attempts failed (2 INCORRECT_NUMERICAL, 1 COMPILE_ERROR); "
        "latest INCORRECT_NUMERICAL: output `y`: 12 of 4096 elements off")


def test_passing_without_gain_asks_for_another_approach():
    assert guidance([PASSED] * 5, stall=7) == (
        "the last 7 attempts did not beat the best: try a different approach, not a small variation")


def test_nothing_useful_to_say_is_none():
    assert guidance([], stall=0) is None
    assert guidance([PASSED, failed("COMPILE_ERROR")], stall=1) is None
    assert guidance([failed("RUNTIME_ERROR")], stall=1) is None  # one failure is not a pattern


def test_partial_passes_of_the_tuners_halving_are_not_failures():
    partial = [Recent("PARTIAL", None)] * 4 + [Recent("PASSED", None)]
    assert guidance(partial, stall=0) is None
    assert guidance([Recent("PARTIAL", None), Recent("TIMEOUT", "killed"), Recent("PARTIAL", None)], 0) is None


def test_long_error_lines_are_cut():
    text = guidance([failed("RUNTIME_ERROR", "x" * 1000)] * 2, stall=2)
    assert text.startswith("the last 2 attempts crashed at run time: xxx") and len(text) < 260


def test_an_unknown_status_is_still_reported():
    assert guidance([failed("SOMETHING_NEW")] * 3, stall=3) == "the last 3 attempts ended SOMETHING_NEW"


BEST = Candidate("best", "cuda", parent_hash="p0")
CHILD = Candidate("child", "cuda", parent_hash="best")
SIBLING = Candidate("sibling", "cuda", parent_hash="p1")
TRITON = Candidate("triton", "triton", parent_hash=None)


def test_the_parent_is_the_best_until_the_problem_stalls():
    assert parent_for([BEST, CHILD, TRITON], stall=2, diverse_after=6) == BEST
    assert parent_for([], stall=10, diverse_after=6) is None


def test_a_stalled_problem_gets_a_diverse_parent():
    assert parent_for([BEST, CHILD, SIBLING, TRITON], stall=6, diverse_after=6) == TRITON  # another language
    assert parent_for([BEST, CHILD, SIBLING], stall=6, diverse_after=6) == SIBLING  # not the best's child
    assert parent_for([BEST, CHILD], stall=6, diverse_after=6) == BEST  # nothing diverse: the best


def test_the_default_language_is_cuda_on_a_gpu():
    assert default_language("cpu") == "pytorch"
    assert default_language("cuda") == default_language("h200") == "cuda"

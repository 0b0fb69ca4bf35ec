"""Faults of the evaluator's machine are not verdicts (DESIGN.md, What PASSED means, 7; issue 25):
a file size limit (the stand-in for a full disk) that refuses the reference's input sets, or the
evaluator's own files, raises `EvaluatorFault` (retryable: the task gives the attempt back and tries
again later) instead of recording INVALID_REFERENCE or RUNTIME_ERROR. The limit is injected with
RLIMIT_FSIZE in a process of its own, which its children inherit."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import pytest

from services.evaluator.protocol import is_fault
from shared.errors import EvaluatorFault, RetryableError

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import dataclasses, resource, sys
from pathlib import Path
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests/evaluator"]
from evalkit import FAST, TOLERANCE, affine_definition, make_problem, make_solution
from services.evaluator.evaluate import evaluate
from shared.errors import EvaluatorFault

limit = int(sys.argv[3])
spec = {"x": {"type": "random"}, "w": {"type": "random"}, "b": {"type": "random"}}
# x and y of 65536 x 16 float32: 4 MiB each, an input set's file over a 1 MiB limit.
workloads = [{"uuid": "big", "axes": {"n": 65536}, "inputs": spec, "tolerance": TOLERANCE["float32"]}]
problem = make_problem(Path(sys.argv[2]), affine_definition(), workloads)
solution = make_solution("def run(x, w, b, y):\n    y.copy_(x * w + b)\n")
config = dataclasses.replace(FAST, regenerate_inputs=False, fork_server=False, scratch_dir=Path(sys.argv[2]) / "scratch")
if limit:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    result = evaluate(problem, solution, config)
    print("VERDICT", result.status.value, result.message[:400].replace("\n", " "))
except EvaluatorFault as fault:
    print("FAULT", str(fault)[:400].replace("\n", " "))
"""


def run_with_file_limit(tmp_path: Path, limit: int) -> str:
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(REPO), str(tmp_path), str(limit)], capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_input_sets_refused_by_a_file_size_limit_are_the_evaluators_fault(tmp_path: Path) -> None:
    line = run_with_file_limit(tmp_path, 1 << 20)
    assert line.startswith("FAULT "), line
    assert "saving input set 0 failed" in line and "File too large" in line


def test_the_evaluators_own_files_refused_are_its_fault(tmp_path: Path) -> None:
    line = run_with_file_limit(tmp_path, 64)  # not even the child's job file fits
    assert line.startswith("FAULT "), line
    assert "the evaluator's machine refused its own I/O" in line and "File too large" in line


def test_without_the_limit_the_same_attempt_passes(tmp_path: Path) -> None:
    assert run_with_file_limit(tmp_path, 0).startswith("VERDICT PASSED")


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EFBIG, errno.EMFILE, errno.ENFILE, errno.EDQUOT])
def test_machine_faults_are_told_apart_from_other_errors(code: int) -> None:
    assert is_fault(OSError(code, "refused"))
    assert issubclass(EvaluatorFault, RetryableError)  # the evaluate task retries it with backoff


@pytest.mark.parametrize("error", [OSError(errno.ENOENT, "missing"), OSError(errno.EACCES, "denied"),
                                   ValueError("not an OSError"), OSError("no errno")])
def test_other_errors_are_not_faults(error: BaseException) -> None:
    assert not is_fault(error)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a machine with CUDA makes its context")
def test_a_cuda_context_that_cannot_be_made_is_the_evaluators_fault(affine) -> None:
    """Device `cuda` where no CUDA context can be made (this CPU machine stands in for a GPU whose
    driver is gone): the reference's child says so and the attempt is no verdict, neither the
    problem's INVALID_REFERENCE nor the solution's RUNTIME_ERROR."""
    import dataclasses

    from evalkit import FAST, make_solution
    from services.evaluator.evaluate import evaluate

    with pytest.raises(EvaluatorFault, match="the evaluator could not use cuda:0 here"):
        evaluate(affine, make_solution("def run(x, w, b, y):\n    y.copy_(x * w + b)\n"),
                 dataclasses.replace(FAST, device="cuda"))

"""The runner for the reward-hack suite: each case is one solution evaluated end to end (build,
reference child, candidate child, checks) on the tiny affine problem of `evalkit` (or a variant),
with its FAST config, on the CPU.

An attempt costs two child processes that import torch (about 3 s of CPU), so a module's selected
cases are started together when its first test asks for one and run two at a time; each test then
checks its own attempt.

Placeholders in a case's code: `@DROP@` is a folder of its own outside the attempt folder that the
candidate may write whoever it runs as (a stand-in for "somewhere that outlives the attempt"; the
sandbox leaves it writable through `KERNELSWARM_SANDBOX_WRITABLE`, all else outside the candidate's
own folders being read-only where the machine allows),
`@PORT@` a loopback port where the test session listens.
"""

from __future__ import annotations

import dataclasses
import shutil
import socket
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from services.evaluator.evaluate import AttemptResult, evaluate
from services.evaluator.sandbox.isolation import WRITABLE_ENV
from shared.schema import Problem, Status, load_problem
from tests.evaluator.evalkit import (
    FAST, affine_definition, affine_workloads, make_problem, make_solution, write_problem,
)

WORKERS = 2
SECRETS = {"KERNELSWARM_HACKS_SECRET": "evaluator-only-7f3a", "OPENAI_API_KEY": "sk-hacks-suite-not-real"}


@dataclass(frozen=True)
class Case:
    id: str
    status: Status  # the status every workload must get
    code: str
    caught: str = ""  # a phrase the verdict's message must contain: where it was caught
    problem: str = "affine_float32"
    solution: dict[str, Any] = field(default_factory=dict)  # make_solution's keywords
    evaluations: int = 1  # >1: the same solution evaluated again; the last evaluation is checked
    statuses: tuple[Status, ...] | None = None  # per workload, where they differ
    config: dict[str, Any] = field(default_factory=dict)  # EvalConfig fields other than FAST's


@dataclass(frozen=True)
class Ran:
    results: list[AttemptResult]  # one per evaluation, in order

    @property
    def result(self) -> AttemptResult:
        return self.results[-1]


class Attempts:
    """The selected cases, evaluated `WORKERS` at a time in the background."""

    def __init__(self, problems: dict[str, Problem], port: int, selected: list[Case], drop: Path) -> None:
        self.problems, self.port, self.drop = problems, port, drop
        self._pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="attempt")
        self._futures: dict[str, Future[Ran]] = {c.id: self._pool.submit(self._run, c) for c in selected}

    def __getitem__(self, case: Case) -> Ran:
        return self._futures[case.id].result()

    def drop_for(self, case: Case) -> Path:
        return self.drop / case.id

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(self.drop, ignore_errors=True)

    def _run(self, case: Case) -> Ran:
        drop = self.drop_for(case)
        drop.mkdir(mode=0o777)
        drop.chmod(0o777)
        code = case.code.replace("@DROP@", str(drop)).replace("@PORT@", str(self.port))
        solution = make_solution(code, self.problems[case.problem].name, name=case.id, **case.solution)
        config = dataclasses.replace(FAST, **case.config)
        return Ran([evaluate(self.problems[case.problem], solution, config) for _ in range(case.evaluations)])


def problems(root: Path) -> dict[str, Problem]:
    found = {f"affine_{dtype}": make_problem(root, affine_definition(dtype), affine_workloads(dtype))
             for dtype in ("float32", "bfloat16")}
    # `w` read from a file: the input sets of its workloads reach the candidate as files.
    from_file = {"x": {"type": "random"}, "b": {"type": "random"},
                 "w": {"type": "safetensors", "path": "data/w.safetensors", "tensor_key": "w"}}
    folder = write_problem(root, affine_definition(name="affine_from_file"), affine_workloads(inputs=from_file))
    (folder / "data").mkdir()
    save_file({"w": torch.linspace(-2.0, 2.0, 16)}, str(folder / "data" / "w.safetensors"))
    found["affine_from_file"] = load_problem(folder, with_seeds=False)
    return found


def start_attempts(request: pytest.FixtureRequest, tmp: Path, cases: list[Case]) -> Iterator[Attempts]:
    """Start the cases this session selected from `request.module` (by their `case` parameter)."""
    params = [getattr(getattr(item, "callspec", None), "params", {})
              for item in request.session.items if item.module is request.module]
    selected = {p["case"].id for p in params if "case" in p}
    with pytest.MonkeyPatch.context() as env, socket.create_server(("127.0.0.1", 0)) as listener:
        for name, value in SECRETS.items():
            env.setenv(name, value)  # the evaluator's own secrets: the candidate must not see them
        env.setenv("OMP_NUM_THREADS", "1")  # two children at a time on a small machine
        drop = Path(tempfile.mkdtemp(prefix="ks-hacks-", dir="/tmp"))
        drop.chmod(0o777)  # the candidate may run as `nobody`
        env.setenv(WRITABLE_ENV, str(drop))  # and writes nothing else (sandbox.candidate_view)
        runner = Attempts(problems(tmp), listener.getsockname()[1], [c for c in cases if c.id in selected], drop)
        try:
            yield runner
        finally:
            runner.close()


def assert_status(ran: Ran, case: Case) -> None:
    """Every workload got the case's status (or its per-workload statuses); the attempt's message
    names where it was caught."""
    result = ran.result
    expected = list(case.statuses or (case.status,) * len(result.traces))
    got = [t.evaluation.status.value for t in result.traces]
    assert got == [s.value for s in expected], f"got {got}: {result.message}"
    assert result.status is case.status, f"got {result.status.value}: {result.message}"
    if case.status is not Status.PASSED:
        assert result.latency_ms is None and result.sol_score is None
        assert case.caught in result.message, f"{case.caught!r} not in: {result.message}"


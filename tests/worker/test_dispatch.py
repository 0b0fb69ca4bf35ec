"""The tuner's per-shape solution: each workload's shapes go to the variant that was fastest there.
Checked three ways: the generated module itself, a real CPU evaluation of it, and the writer finding
the winners in the traces of the problem."""

from __future__ import annotations

import importlib.util
import random
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from tests.evaluator.evalkit import FAST, affine_definition, affine_workloads, make_problem
from services.evaluator.evaluate import evaluate
from services.worker import write
from services.worker.tuner import DISPATCH_FILE, dispatch_solution, propose, shape_key, with_tunables
from shared.db import AttemptRow, TraceRow, utcnow
from shared.repository import put_solution, upsert_problem
from shared.runtime import Runtime
from shared.schema import Solution, Status, load_problem
from shared.settings import Settings

PROBLEMS = Path(__file__).resolve().parents[2] / "problems"
# y[0, 0] says which variant ran (for the in-process check only).
MARKING = "def run(x, w, b, y):\n    y.copy_(x * w + b)\n    y[0, 0] = CHUNK\n"
AFFINE = "def run(x, w, b, y):\n    for rows in x.split(CHUNK):\n        pass\n    y.copy_(x * w + b)\n"


def affine_seed(body: str) -> Solution:
    return Solution.model_validate({
        "name": "affine_seed", "definition": "affine_float32", "author": "tests",
        "spec": {"languages": ["pytorch"], "target_hardware": ["CPU"], "entry_point": "main.py::run",
                 "tunables": {"CHUNK": [1, 2, 4]}},
        "sources": [{"path": "main.py", "content": body}]})


def test_each_shape_runs_its_winner_and_other_shapes_the_default(tmp_path):
    seed = affine_seed(MARKING)
    small, large = ((3, 16), (16,), (16,), (3, 16)), ((7, 16), (16,), (16,), (7, 16))
    solution = dispatch_solution(seed, {small: {"CHUNK": 1}, large: {"CHUNK": 4}}, {"CHUNK": 2})
    assert solution is not None and solution.entry_file == DISPATCH_FILE and not solution.spec.tunables
    for source in solution.sources:
        (tmp_path / source.path).write_text(source.content)
    spec = importlib.util.spec_from_file_location("dispatch_under_test", tmp_path / DISPATCH_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for rows, chunk in ((3, 1), (7, 4), (5, 2)):  # 5 rows: no winner, the default
        x, w, b, y = torch.ones(rows, 16), torch.ones(16), torch.ones(16), torch.empty(rows, 16)
        module.run(x, w, b, y)
        assert y[0, 0].item() == chunk
    sys.modules.pop("dispatch_under_test", None)


def test_no_dispatch_without_two_winners_or_for_a_compiled_language():
    seed = affine_seed(MARKING)
    key = ((3, 16),)
    assert dispatch_solution(seed, {key: {"CHUNK": 2}}, {"CHUNK": 2}) is None
    cuda = seed.model_copy(update={"spec": seed.spec.model_copy(update={"languages": ["cuda"]})})
    assert dispatch_solution(cuda, {key: {"CHUNK": 1}, ((7, 16),): {"CHUNK": 4}}, {"CHUNK": 2}) is None


def test_the_dispatching_solution_passes_the_evaluator(tmp_path):
    problem = make_problem(tmp_path, affine_definition("float32"), affine_workloads("float32"))
    seed = affine_seed(AFFINE)
    keys = [shape_key(problem.definition, w, True) for w in problem.workloads]
    assert keys == [((3, 16), (16,), (16,), (3, 16)), ((7, 16), (16,), (16,), (7, 16))]
    solution = dispatch_solution(seed, {keys[0]: {"CHUNK": 1}, keys[1]: {"CHUNK": 4}}, {"CHUNK": 2})
    result = evaluate(problem, solution, FAST)
    assert result.status is Status.PASSED, result.message


def test_the_tuner_proposes_it_after_the_seeds_and_once():
    seed = affine_seed(AFFINE)
    dispatch = dispatch_solution(seed, {((3, 16),): {"CHUNK": 1}, ((7, 16),): {"CHUNK": 4}}, {"CHUNK": 2})
    written = with_tunables(seed, {"CHUNK": 1})
    tried = {written.content_hash()}
    first = propose([seed], tried, (written, written.content_hash()), random.Random(0), lambda: dispatch)
    assert first.solution == dispatch and first.reason == "each shape to its fastest variant"
    tried.add(dispatch.content_hash())
    assert propose([seed], tried, (written, written.content_hash()), random.Random(0),
                   lambda: dispatch).solution != dispatch


def test_the_writer_finds_the_winners_in_the_problems_traces(tmp_path):
    runtime = Runtime(Settings(home=tmp_path, problems_dir=PROBLEMS))
    problem = load_problem(PROBLEMS / "llama31_8b_rmsnorm")
    seed = problem.seed("pytorch")
    values = [{"CHUNK_ROWS": 0, "FP32_WEIGHT": False}, {"CHUNK_ROWS": 128, "FP32_WEIGHT": False}]
    try:
        with runtime.db.session() as session:
            problem_id = upsert_problem(session, problem).id
            hashes = [put_solution(session, runtime.store, problem_id, with_tunables(seed, v)) for v in values]
            for k, digest in enumerate(hashes):  # variant 0 wins the first workload, variant 1 the others
                attempt = AttemptRow(id=f"a{k}", problem_id=problem_id, solution_hash=digest, device="cpu",
                                     status="PASSED", speedup=1.0 + k, created_at=utcnow() - timedelta(minutes=1))
                session.add(attempt)
                session.flush()
                for n, workload in enumerate(problem.workloads):
                    fast = (n == 0) == (k == 0)
                    session.add(TraceRow(attempt_id=attempt.id, workload_uuid=workload.uuid, status="PASSED",
                                         latency_ms=1.0 if fast else 2.0, trace_json="{}"))
        job = write.Job(assignment_id=0, campaign_id=0, problem_id=problem_id, problem_name=problem.name,
                        device="cpu", remaining=1, made_before=0, language="pytorch", parent_hash=None,
                        guidance=None, seeds=(seed,))
        best = (with_tunables(seed, values[1]), hashes[1])
        with runtime.db.session() as session:
            solution = write._dispatch(runtime, session, job, best)
    finally:
        runtime.db.dispose()
    assert solution is not None
    source = next(s.content for s in solution.sources if s.path == DISPATCH_FILE)
    first = shape_key(problem.definition, problem.workloads[0], seed.spec.destination_passing_style)
    namespace: dict = {}
    exec(source.split("\n\ndef _load")[0], namespace)  # the tables only
    assert namespace["VARIANTS"][namespace["BY_SHAPES"][first]] == values[0]
    assert all(namespace["VARIANTS"][namespace["BY_SHAPES"][shape_key(problem.definition, w, True)]] == values[1]
               for w in problem.workloads[1:])
    assert namespace["VARIANTS"][namespace["DEFAULT"]] == values[1]


@pytest.fixture(autouse=True)
def _fresh_solution_cache():
    write._SOLUTIONS.clear()

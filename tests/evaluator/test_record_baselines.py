"""torch.compile baselines are stored once per (problem, workload, hardware), failures included."""

from __future__ import annotations

from services.evaluator.record import compile_baselines, store_compile_baselines
from shared.db import Database, ProblemRow


def test_compile_baselines_are_cached_once(tmp_path):
    db = Database(f"sqlite:///{tmp_path}/b.db")
    with db.session() as session:
        problem = ProblemRow(name="p", definition_json="{}", workloads_jsonl="")
        session.add(problem)
        session.flush()
        problem_id = problem.id
    assert compile_baselines(db, problem_id, "NVIDIA H200") == {}
    store_compile_baselines(db, problem_id, "NVIDIA H200", {"w1": 0.5, "w2": None}, {})
    cached = compile_baselines(db, problem_id, "NVIDIA H200")
    assert cached == {"w1": 0.5, "w2": None}  # a reference that did not compile is not tried again
    # A second evaluator that measured the same workload meanwhile does not fail the attempt.
    store_compile_baselines(db, problem_id, "NVIDIA H200", {"w1": 0.7}, {})
    assert compile_baselines(db, problem_id, "NVIDIA H200")["w1"] == 0.5
    assert compile_baselines(db, problem_id, "NVIDIA B200") == {}
    db.dispose()

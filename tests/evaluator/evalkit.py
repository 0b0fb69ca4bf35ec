"""Helpers for the evaluator tests: tiny problems written to a temp folder, solutions built from
source strings, and a fast CPU evaluation config (a few seconds per attempt)."""

from __future__ import annotations

import fcntl
import json
import os
import textwrap
from pathlib import Path
from typing import Any

from services.evaluator.config import EvalConfig
from shared.schema import Problem, Solution, load_problem

REPO = Path(__file__).resolve().parents[2]
PROBLEMS_DIR = REPO / "problems"

# regenerate_inputs: the GPU's way of handing over random sets (on a CPU the default is files), so
# that the suites here test what runs in production.
FAST = EvalConfig(device="cpu", correctness_rounds=2, timing_sets=2, warmup_runs=1, timing_runs=3,
                  timing_budget_s=0.2, attempt_timeout_s=60.0, regenerate_inputs=True)

TOLERANCE = {
    "float32": {"max_atol": 1e-5, "max_rtol": 1e-5},
    "bfloat16": {"max_atol": 1e-2, "max_rtol": 2e-2},
}


def affine_definition(dtype: str = "float32", name: str | None = None, reference: str | None = None) -> dict:
    """y[n, d] = x[n, d] * w[d] + b[d]: the norm-style weight and bias are inputs like any other."""
    return {
        "name": name or f"affine_{dtype}",
        "description": "y = x * w + b, broadcast over rows",
        "axes": {"n": {"type": "var"}, "d": {"type": "const", "value": 16}},
        "inputs": {
            "x": {"shape": ["n", "d"], "dtype": dtype},
            "w": {"shape": ["d"], "dtype": dtype},
            "b": {"shape": ["d"], "dtype": dtype},
        },
        "outputs": {"y": {"shape": ["n", "d"], "dtype": dtype}},
        "reference": reference or "import torch\n\ndef run(x, w, b):\n    return x * w + b\n",
    }


def affine_workloads(dtype: str = "float32", inputs: dict | None = None) -> list[dict]:
    spec = inputs or {"x": {"type": "random"}, "w": {"type": "random"}, "b": {"type": "random"}}
    return [{"uuid": f"affine-n{n}", "axes": {"n": n}, "inputs": spec, "tolerance": TOLERANCE[dtype]}
            for n in (3, 7)]


def write_problem(root: Path, definition: dict, workloads: list[dict]) -> Path:
    """A problem folder as a user would lay it out; returns the folder."""
    folder = root / definition["name"]
    folder.mkdir(parents=True)
    (folder / "definition.json").write_text(json.dumps(definition, indent=2))
    (folder / "workload.jsonl").write_text("".join(json.dumps(w) + "\n" for w in workloads))
    return folder


def make_problem(root: Path, definition: dict, workloads: list[dict]) -> Problem:
    return load_problem(write_problem(root, definition, workloads), with_seeds=False)


def make_solution(code: str, definition: str = "affine_float32", *, name: str = "candidate", dps: bool = True,
                  language: str = "pytorch", tunables: dict[str, list] | None = None,
                  tunable_values: dict[str, Any] | None = None, entry: str = "main.py::run",
                  extra_sources: dict[str, str] | None = None) -> Solution:
    """A solution whose entry file (`main.py` unless `entry` names another) holds `code`, dedented."""
    sources = [{"path": entry.split("::")[0], "content": textwrap.dedent(code).lstrip()}]
    sources += [{"path": p, "content": c} for p, c in (extra_sources or {}).items()]
    return Solution.model_validate({
        "name": name,
        "definition": definition,
        "author": "tests",
        "spec": {
            "languages": [language],
            "target_hardware": ["CPU"],
            "entry_point": entry,
            "destination_passing_style": dps,
            "tunables": tunables or {},
            "tunable_values": tunable_values or {},
        },
        "sources": sources,
    })


def seed_solution(problem_dir: Path) -> Solution:
    return load_problem(problem_dir).seed("pytorch")


def lock_is_free(path: Path) -> bool:
    """Whether no process holds `path`'s flock any more (a child that took it and still runs does).
    Children judged this way live in PID namespaces of their own, where the pid they could write
    down means nothing outside."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)

"""Language `cute_dsl` on a real GPU: the PROTOCOL.md example (elementwise), a row reduction, and a
kernel the DSL refuses. Needs nvidia-cutlass-dsl on the GPU machine (../shared/device-wheels/cute-dsl
gives the recipe). Run there: `pytest -m gpu tests/gpu/test_cute_dsl.py`."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from services.evaluator.languages import cutedsl  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
              pytest.mark.skipif(not cutedsl.available(), reason="nvidia-cutlass-dsl is not installed here")]

from services.evaluator.evaluate import evaluate  # noqa: E402
from services.worker.agent import PROTOCOL  # noqa: E402
from shared.schema import Solution, Status, load_problem  # noqa: E402
from test_cuda_language import config, problem  # noqa: E402,F401 - shared fixtures

ROWSUM = """
import cutlass
import cutlass.cute as cute

THREADS = 128


@cute.kernel
def rowsum_kernel(x: cute.Tensor, y: cute.Tensor, rows: cutlass.Int32, cols: cutlass.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    r = bidx * THREADS + tidx
    if r < rows:
        acc = cutlass.Float32(0.0)
        for c in cutlass.range(cols):
            acc += x[r, c]
        y[r] = acc


@cute.jit
def run(x: cute.Tensor, y: cute.Tensor):
    rows, cols = x.shape
    rowsum_kernel(x, y, rows, cols).launch(grid=((rows + THREADS - 1) // THREADS, 1, 1), block=(THREADS, 1, 1))
"""

REFUSED = """
import cutlass.cute as cute


@cute.jit
def run(x: cute.Tensor, w: float, y: cute.Tensor):  # w arrives as a tensor: the DSL refuses
    pass
"""


def cute_solution(name: str, definition: str, source: str) -> Solution:
    return Solution.model_validate({
        "name": name, "definition": definition, "author": "test",
        "spec": {"languages": ["cute_dsl"], "target_hardware": ["H200"], "entry_point": "kernel.py::run"},
        "sources": [{"path": "kernel.py", "content": source}]})


@pytest.fixture(scope="module")
def rowsum(readable_tmp):
    root = Path(tempfile.mkdtemp(prefix="rowsum-", dir=readable_tmp))
    root.chmod(0o755)
    (root / "definition.json").write_text(json.dumps({
        "name": "rowsum", "op_type": "reduction", "axes": {"m": {"type": "var"}, "k": {"type": "const", "value": 512}},
        "inputs": {"x": {"shape": ["m", "k"], "dtype": "float32"}}, "outputs": {"y": {"shape": ["m"], "dtype": "float32"}},
        "reference": "import torch\n\ndef run(x):\n    return x.sum(dim=1)\n"}))
    (root / "workload.jsonl").write_text("".join(json.dumps(
        {"uuid": f"m{m}", "axes": {"m": m}, "inputs": {"x": {"type": "random"}},
         "tolerance": {"max_atol": 1e-3, "max_rtol": 1e-3}}) + "\n" for m in (1000, 8192)))
    return load_problem(root)


def test_the_protocol_example_passes(problem, config):  # noqa: F811
    source = next(b for b in re.findall(r"```python\n(.*?)```", PROTOCOL, re.DOTALL) if "@cute.jit" in b)
    result = evaluate(problem, cute_solution("scale_cute", "scale", source), config)
    assert result.status is Status.PASSED, result.message
    assert result.child_phases["candidate"]["compile"] > 0  # compiled, and the time kept apart


def test_a_row_reduction_passes(rowsum, config):  # noqa: F811
    result = evaluate(rowsum, cute_solution("rowsum_cute", "rowsum", ROWSUM), config)
    assert result.status is Status.PASSED, result.message


def test_a_kernel_the_dsl_refuses_is_a_compile_error(problem, config):  # noqa: F811
    result = evaluate(problem, cute_solution("refused_cute", "scale", REFUSED), config)
    assert result.status is Status.COMPILE_ERROR and "ARG_ANNOTATION_MISMATCH" in result.message, result.message

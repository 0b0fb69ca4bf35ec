"""SOL-ExecBench's other languages on a real GPU: `cuda_cpp` (a torch extension built by
cpp_extension, cached by build key) and `triton`. Run on the GPU machine: `pytest -m gpu tests/gpu`.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from services.evaluator.evaluate import evaluate  # noqa: E402
from shared.schema import Solution, Status  # noqa: E402
from test_cuda_language import config, problem  # noqa: E402,F401 - shared fixtures

CUDA_CPP = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void scale_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                             long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * w[i];
}

void run(torch::Tensor x, torch::Tensor w, torch::Tensor y) {
    long n = y.numel();
    scale_kernel<<<(n + BLOCK - 1) / BLOCK, BLOCK, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(), n);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run); }
"""

TRITON = """
import triton
import triton.language as tl


@triton.jit
def _scale(x, w, y, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y + offsets, tl.load(x + offsets, mask=mask) * tl.load(w + offsets, mask=mask), mask=mask)


def run(x, w, y):
    n = y.numel()
    _scale[(triton.cdiv(n, 1024),)](x, w, y, n, BLOCK=1024)
"""


def solution(language: str, path: str, content: str, tunables: dict | None = None) -> Solution:
    return Solution.model_validate({
        "name": f"scale_{language}", "definition": "scale", "author": "test",
        "spec": {"languages": [language], "target_hardware": ["H200"], "entry_point": f"{path}::run",
                 "tunables": tunables or {}},
        "sources": [{"path": path, "content": content}]})


def test_cuda_cpp_builds_once_and_passes(problem, config, tmp_path):
    from shared.store import LocalStore

    cached = dataclasses.replace(config, build_cache=LocalStore(tmp_path / "store"))
    result = evaluate(problem, solution("cuda_cpp", "scale.cu", CUDA_CPP, {"BLOCK": [256]}), cached)
    assert result.status is Status.PASSED, result.message
    again = evaluate(problem, solution("cuda_cpp", "scale.cu", CUDA_CPP, {"BLOCK": [256]}), cached)
    assert again.status is Status.PASSED, again.message


def test_cuda_cpp_compile_error_is_reported(problem, config):
    broken = "__global__ void k(float* y) { y[0] = undeclared_name; }\n"
    result = evaluate(problem, solution("cuda_cpp", "broken.cu", broken), config)
    assert result.status is Status.COMPILE_ERROR
    assert "undeclared_name" in result.message


def test_triton_solution_passes(problem, config):
    result = evaluate(problem, solution("triton", "main.py", TRITON), config)
    assert result.status is Status.PASSED, result.message


SIDE_STREAM = """
import torch


def run(x, w, y):
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(4_000_000)  # about 2 ms of GPU time, on a stream the events do not watch
        torch.mul(x, w, out=y)
"""


def test_work_on_a_side_stream_is_timed(problem, config):
    """CUPTI records every stream: the side stream's 2 ms count although the current stream is idle."""
    result = evaluate(problem, solution("pytorch", "main.py", SIDE_STREAM), config)
    assert result.status is Status.PASSED, result.message
    for trace in result.traces:
        timing = trace.evaluation.timing
        assert timing.clock == "cupti"
        assert timing.median_ms > 1.0, timing
        assert timing.event_median_ms < timing.median_ms / 2, timing

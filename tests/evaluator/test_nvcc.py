"""The `cuda` build runs on any machine with nvcc: CI compiles the test kernels for sm_90a and sm_100a."""

from __future__ import annotations

import shutil

import pytest

from services.evaluator.languages import nvcc
from shared.schema import Solution
from shared.store import LocalStore

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")

SCALE_CU = r"""
extern "C" __global__ void scale(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i], r;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(v), "f"((float)FACTOR));  // inline PTX
    y[i] = r;
}
"""


def solution(cu: str = SCALE_CU, tunables: dict | None = None, extra: list | None = None) -> Solution:
    sources = [{"path": "launch.py", "content": "def run(x, y, *, kernels):\n    pass\n"}]
    sources += [{"path": f"k{i}.cu", "content": c} for i, c in enumerate([cu] if isinstance(cu, str) else cu)]
    return Solution.model_validate({
        "name": "scale", "definition": "scale", "author": "test",
        "spec": {"languages": ["cuda"], "target_hardware": ["H200"], "entry_point": "launch.py::run",
                 "tunables": tunables or {"FACTOR": [2, 3]}},
        "sources": sources})


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_inline_ptx_kernel_builds_to_a_cubin(tmp_path, arch):
    built = nvcc.build_cubin(solution(), arch, {"FACTOR": 2}, tmp_path / "b")
    assert built.ok, built.log
    assert built.cubin[:4] == b"\x7fELF"
    assert not built.cached


def test_second_build_of_the_same_candidate_calls_no_compiler(tmp_path, monkeypatch):
    cache = LocalStore(tmp_path / "store")
    first = nvcc.build_cubin(solution(), "sm_90a", {"FACTOR": 2}, tmp_path / "b1", cache)
    assert first.ok and not first.cached
    monkeypatch.setattr(nvcc.shutil, "which", lambda _name: None)  # no compiler from here on
    second = nvcc.build_cubin(solution(), "sm_90a", {"FACTOR": 2}, tmp_path / "b2", cache)
    assert second.ok and second.cached and second.cubin == first.cubin
    other = nvcc.build_cubin(solution(), "sm_90a", {"FACTOR": 3}, tmp_path / "b3", cache)
    assert not other.ok and "nvcc is not on PATH" in other.log  # a new tunable value is a new build


def test_build_key_covers_sources_tunables_and_arch():
    base = nvcc.build_key(solution(), "sm_90a", {"FACTOR": 2})
    assert base == nvcc.build_key(solution(), "sm_90a", {"FACTOR": 2})
    assert base != nvcc.build_key(solution(), "sm_100a", {"FACTOR": 2})
    assert base != nvcc.build_key(solution(), "sm_90a", {"FACTOR": 3})
    assert base != nvcc.build_key(solution(SCALE_CU + "\n// changed\n"), "sm_90a", {"FACTOR": 2})


def test_several_cu_files_become_one_cubin(tmp_path):
    other = 'extern "C" __global__ void fill(float* y, int n) { int i = threadIdx.x; if (i < n) y[i] = 1.0f; }'
    built = nvcc.build_cubin(solution([SCALE_CU, other]), "sm_90a", {"FACTOR": 2}, tmp_path / "b")
    assert built.ok, built.log
    assert b"scale" in built.cubin and b"fill" in built.cubin


def test_compile_error_keeps_the_lines_an_agent_needs(tmp_path):
    broken = SCALE_CU.replace("y[i] = r;", "y[i] = undefined_name;")
    built = nvcc.build_cubin(solution(broken), "sm_90a", {"FACTOR": 2}, tmp_path / "b")
    assert not built.ok
    assert "undefined_name" in built.log and "error" in built.log
    assert "k0.cu" in built.log and str(tmp_path) not in built.log  # relative paths only
    assert len(built.log) <= nvcc.MAX_LOG_CHARS + 20


def test_bad_inline_ptx_is_a_compile_error(tmp_path):
    broken = SCALE_CU.replace("mul.rn.f32", "mul.bogus.f32")
    built = nvcc.build_cubin(solution(broken), "sm_90a", {"FACTOR": 2}, tmp_path / "b")
    assert not built.ok and "ptxas" in built.log.lower()


def test_arch_for_capability():
    assert nvcc.arch_for((9, 0)) == "sm_90a"
    assert nvcc.arch_for((10, 0)) == "sm_100a"
    assert nvcc.arch_for((7, 5)) == "sm_75"
    assert nvcc.gencode("sm_90a") == "-gencode=arch=compute_90a,code=sm_90a"

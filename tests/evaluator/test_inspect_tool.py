"""The `inspect` tool on a real build (nvcc is on CI's machine; no GPU is needed): ptxas's figures
per kernel, the SASS of the kernel named, the names where an unknown one is asked for. SASS needs
cuobjdump beside nvcc (and nvdisasm, which it calls); where it is missing the answer says so."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from services.evaluator.tools import inspect_build
from services.evaluator.tools.inspect_build import SASS_CHARS, inspect_solution, trim_sass
from shared.schema import Solution, Status

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")

KERNELS_CU = r"""
extern "C" __global__ void scale(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
extern "C" __global__ void stage_add(const float* x, const float* z, float* y, int n) {
    __shared__ float tile[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    tile[threadIdx.x] = i < n ? x[i] : 0.f;
    __syncthreads();
    if (i < n) y[i] = tile[255 - threadIdx.x] + z[i];
}
"""
# Many independent products kept live at once: a long listing (the SASS budget), and registers.
LONG_CU = r"""
extern "C" __global__ void long_one(const float* x, float* y) {
    float acc[64];
    #pragma unroll
    for (int k = 0; k < 64; ++k) acc[k] = x[threadIdx.x + 32 * k] * (k + 1.5f);
    float s = 0.f;
    #pragma unroll
    for (int k = 0; k < 64; ++k) s += acc[k] * acc[63 - k];
    y[threadIdx.x] = s;
}
"""


def cuda_solution(cu: str = KERNELS_CU) -> Solution:
    return Solution.model_validate({
        "name": "two", "definition": "two", "author": "test",
        "spec": {"languages": ["cuda"], "target_hardware": ["H100"], "entry_point": "launch.py::run"},
        "sources": [{"path": "kernels.cu", "content": cu},
                    {"path": "launch.py", "content": "def run(x, y, *, kernels):\n    pass\n"}]})


def has_sass_tools() -> bool:
    tool = inspect_build.cuobjdump_path(shutil.which("nvcc") or "nvcc")
    return tool is not None and (shutil.which("nvdisasm") is not None or (Path(tool).parent / "nvdisasm").is_file())


def figures(text: str, kernel: str) -> dict[str, int]:
    line = next(line for line in text.splitlines() if line.strip().startswith(f"kernel {kernel}:"))
    pairs = [part.strip().rsplit(" ", 1) for part in line.split(":", 1)[1].split(",")]
    return {label: int(value) for label, value in pairs}


def test_ptxas_figures_of_every_kernel(tmp_path):
    found = inspect_solution(cuda_solution(), "sm_90a", tmp_path / "b", "scale")
    assert found.status is None, found.text
    assert "2 kernels: scale, stage_add" in found.text
    scale, staged = figures(found.text, "scale"), figures(found.text, "stage_add")
    assert 4 <= scale["registers"] <= 64 and scale["spill stores B"] == 0 and "smem B" not in scale
    assert staged["smem B"] == 1024 and staged["barriers"] == 1  # float[256] and one __syncthreads


def test_an_unknown_kernel_gets_the_names(tmp_path):
    found = inspect_solution(cuda_solution(), "sm_90a", tmp_path / "b", "scal")
    assert found.status is None
    assert "the cubin has no kernel `scal`; its kernels: scale, stage_add" in found.text


def test_no_kernel_named_among_several_asks_for_one(tmp_path):
    found = inspect_solution(cuda_solution(), "sm_90a", tmp_path / "b")
    assert "SASS: name a kernel (one of: scale, stage_add)" in found.text


@pytest.mark.skipif(not has_sass_tools(), reason="cuobjdump and nvdisasm are not installed beside nvcc")
def test_sass_of_the_named_kernel_only(tmp_path):
    found = inspect_solution(cuda_solution(), "sm_90a", tmp_path / "b", "stage_add")
    sass = found.text.split("SASS of stage_add:\n", 1)[1]
    assert "BAR.SYNC" in sass and "STS" in sass and "EXIT" in sass  # its shared tile and barrier
    assert "FMUL" not in sass  # scale's multiply is not there
    assert "0x000f" not in sass  # encodings dropped


@pytest.mark.skipif(not has_sass_tools(), reason="cuobjdump and nvdisasm are not installed beside nvcc")
def test_a_long_listing_is_cut_to_its_budget(tmp_path):
    found = inspect_solution(cuda_solution(LONG_CU), "sm_90a", tmp_path / "b", "long_one")
    sass = found.text.split("SASS of long_one:\n", 1)[1]
    assert len(sass) <= SASS_CHARS and "lines left out" in sass
    assert sass.splitlines()[0].startswith("/*0000*/") and "EXIT" in sass.splitlines()[-1]


def test_without_cuobjdump_the_answer_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(inspect_build, "cuobjdump_path", lambda _nvcc: None)
    found = inspect_solution(cuda_solution(), "sm_90a", tmp_path / "b", "scale")
    assert found.status is None and "cuobjdump is not installed" in found.text
    assert figures(found.text, "scale")["registers"] > 0  # ptxas's figures stand


def test_a_build_that_fails_is_a_compile_error_with_nvccs_line(tmp_path):
    broken = KERNELS_CU + '\nextern "C" __global__ void bad() { undefined_thing(); }\n'
    found = inspect_solution(cuda_solution(broken), "sm_90a", tmp_path / "b")
    assert found.status is Status.COMPILE_ERROR and "undefined_thing" in found.text


def test_a_language_without_a_cubin_is_unsupported(tmp_path):
    solution = Solution.model_validate({
        "name": "py", "definition": "two", "author": "test",
        "spec": {"languages": ["pytorch"], "target_hardware": ["H100"], "entry_point": "main.py::run"},
        "sources": [{"path": "main.py", "content": "def run(x):\n    return x\n"}]})
    found = inspect_solution(solution, "sm_90a", tmp_path / "b")
    assert found.status is Status.UNSUPPORTED and "pytorch" in found.text


# cuobjdump 13.2's listing of `scale` above (sm_90a), as printed: header, two lines an instruction.
LISTING = """
\tcode for sm_90a
\t\tFunction : scale
\t.headerflags\t@"EF_CUDA_64BIT_ADDRESS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;              /* 0x00000a00ff017b82 */
                                                                       /* 0x000fe20000000800 */
        /*0070*/               @P0 EXIT ;                              /* 0x000000000000094d */
                                                                       /* 0x000fea0003800000 */
        /*00f0*/                   FMUL R7, R2, UR6 ;                  /* 0x0000000602077c20 */
                                                                       /* 0x004fca0008400000 */
        /*0110*/                   EXIT ;                              /* 0x000000000000794d */
                                                                       /* 0x000fea0003800000 */
        /*0120*/                   BRA 0x120;                          /* 0xfffffffc00fc7947 */
                                                                       /* 0x000fc0000383ffff */
        /*0130*/                   NOP;                                /* 0x0000000000007918 */
                                                                       /* 0x000fc00000000000 */
\t\t..........
"""


def test_trimmed_sass_is_one_line_an_instruction_without_padding():
    assert trim_sass(LISTING) == ("/*0000*/ LDC R1, c[0x0][0x28] ;\n/*0070*/ @P0 EXIT ;\n/*00f0*/ FMUL R7, R2, UR6 ;\n"
                                  "/*0110*/ EXIT ;")

"""shared.sol: work counted from the reference on meta tensors against hand-derived FLOPs and bytes,
T_sol on a made-up GPU with round ceilings, the solar conventions, the score's anchors and the
campaign figures."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from shared.errors import FormatError
from shared.hardware import B200_SOLAR_1500MHZ, HardwareSpec, Peaks, Precision
from shared.schema import Definition, Workload, parse_model
from shared.sol import (
    SOLAR_LAUNCH_FLOOR_MS,
    Bound,
    ProblemOutcome,
    SolCountError,
    SolMode,
    campaign_figures,
    count_work,
    estimate,
    hack_floor_ms,
    load_reference,
    problem_score,
    problem_speedup,
    sol_score,
    trace_sol,
)

# 1 TB/s, 100 TFLOP/s bf16, 50 TF32, 10 FP32: every time below is easy to derive by hand.
GPU = HardwareSpec("test_gpu", "Test GPU", 1000.0,
                   Peaks(fp64=None, fp32=10.0, tf32=50.0, bf16=100.0, fp16=100.0, fp8=200.0), "tests")


def define(axes: dict[str, int | None], inputs: dict[str, tuple[list[str] | None, str]],
           outputs: dict[str, tuple[list[str], str]], reference: str, **extra: Any) -> Definition:
    """`axes`: name -> const value, or None for a var axis."""
    return Definition.model_validate({
        "name": "t",
        "axes": {n: {"type": "var"} if v is None else {"type": "const", "value": v} for n, v in axes.items()},
        "inputs": {n: {"shape": s, "dtype": d} for n, (s, d) in inputs.items()},
        "outputs": {n: {"shape": s, "dtype": d} for n, (s, d) in outputs.items()},
        "reference": reference, **extra})


def random_workload(definition: Definition, **axes: int) -> Workload:
    return Workload.model_validate({"uuid": "w", "axes": axes, "inputs": {
        n: {"type": "random"} if s.shape is not None else {"type": "scalar", "value": 1e-6}
        for n, s in definition.inputs.items()}})


GEMM = define({"M": None, "N": 512, "K": 1024}, {"A": (["M", "K"], "bfloat16"), "B": (["N", "K"], "bfloat16")},
              {"C": (["M", "N"], "bfloat16")}, "import torch\n\ndef run(A, B):\n    return A @ B.T\n")

RMSNORM = define(
    {"T": None, "H": 4096},
    {"x": (["T", "H"], "bfloat16"), "w": (["H"], "bfloat16"), "eps": (None, "float32")},
    {"y": (["T", "H"], "bfloat16")},
    "import torch\n\ndef run(x, w, eps):\n    f = x.to(torch.float32)\n"
    "    f = f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + eps)\n"
    "    return (f * w.to(torch.float32)).to(x.dtype)\n")

SOFTMAX = define({"R": None, "C": 8192}, {"x": (["R", "C"], "float32")}, {"y": (["R", "C"], "float32")},
                 "import torch\n\ndef run(x):\n    return torch.softmax(x, dim=-1)\n")

ATTENTION_AXES = {"B": None, "H": 8, "L": None, "D": 64}
ATTENTION_IO = ({n: (["B", "H", "L", "D"], "bfloat16") for n in "qkv"}, {"o": (["B", "H", "L", "D"], "bfloat16")})


def attention(causal: bool) -> Definition:
    return define(ATTENTION_AXES, *ATTENTION_IO,
                  "import torch.nn.functional as F\n\ndef run(q, k, v):\n"
                  f"    return F.scaled_dot_product_attention(q, k, v, is_causal={causal})\n")


CONV2D = define(
    {"N": None, "C": 64, "K": 128, "H": 56, "W": 56, "R": 3},
    {"x": (["N", "C", "H", "W"], "float32"), "w": (["K", "C", "R", "R"], "float32"), "b": (["K"], "float32")},
    {"y": (["N", "K", "H", "W"], "float32")},
    "import torch.nn.functional as F\n\ndef run(x, w, b):\n    return F.conv2d(x, w, b, stride=1, padding=1)\n")


# --- hand-derived T_sol --------------------------------------------------------------------------

def test_gemm_is_matrix_bound():
    work = count_work(GEMM, random_workload(GEMM, M=256))
    flops = 2 * 256 * 512 * 1024  # 268_435_456
    moved = 2 * (256 * 1024 + 512 * 1024 + 256 * 512)  # A, B read once, C written once: 1_835_008
    assert work.matrix_flops == {Precision.BF16: flops}
    assert work.bytes_moved == moved and work.counted_on == "meta"
    sol = estimate(work, GPU)
    assert sol.t_matrix_ms == pytest.approx(flops / 100e12 * 1e3)  # 0.002684 ms
    assert sol.t_memory_ms == pytest.approx(moved / 1000e9 * 1e3)  # 0.001835 ms
    assert sol.t_sol_ms == pytest.approx(0.00268435456) and sol.bound is Bound.MATRIX


def test_rmsnorm_is_memory_bound_and_counts_no_matrix_work():
    work = count_work(RMSNORM, random_workload(RMSNORM, T=4096))
    moved = 2 * (4096 * 4096 + 4096 + 4096 * 4096)  # x, w read, y written, bf16: 67_117_056
    assert work.total_matrix_flops == 0 and work.bytes_moved == moved
    assert work.vector_flops > 4096 * 4096  # pointwise work and the mean are counted apart
    sol = estimate(work, GPU)
    assert sol.t_sol_ms == pytest.approx(0.067117056) and sol.bound is Bound.MEMORY


def test_softmax_counts_its_vector_work_apart():
    work = count_work(SOFTMAX, random_workload(SOFTMAX, R=1024))
    assert work.bytes_moved == 4 * 2 * 1024 * 8192  # 67_108_864: fp32 in and out
    assert work.vector_flops == 1024 * 8192  # one _softmax over every element
    sol = estimate(work, GPU)
    assert sol.t_vector_ms == pytest.approx(1024 * 8192 / 10e12 * 1e3)
    assert sol.t_sol_ms == pytest.approx(0.067108864) and sol.bound is Bound.MEMORY


def test_attention_counts_both_matmuls_and_agrees_with_flop_counter_mode():
    definition = attention(causal=False)
    work = count_work(definition, random_workload(definition, B=2, L=512))
    flops = 4 * 2 * 8 * 512 * 512 * 64  # QK^T and PV: 2 x 2 x B H L S D = 1_073_741_824
    assert work.matrix_flops == {Precision.BF16: flops}
    assert work.bytes_moved == 2 * 4 * (2 * 8 * 512 * 64)  # q, k, v, o once each: 4_194_304
    sol = estimate(work, GPU)
    assert sol.t_sol_ms == pytest.approx(flops / 100e12 * 1e3) and sol.bound is Bound.MATRIX
    q = torch.empty(2, 8, 512, 64, dtype=torch.bfloat16, device="meta")
    with FlopCounterMode(display=False) as counter:
        load_reference(definition).run(q, q, q)
    assert counter.get_total_flops() == flops


def test_causal_attention_counts_the_kept_half():
    definition = attention(causal=True)
    work = count_work(definition, random_workload(definition, B=2, L=512))
    kept = 512 * 513 // 2  # (query, key) pairs under torch's top-left causal mask
    assert work.total_matrix_flops == 2 * 2 * 8 * kept * (64 + 64)  # 537_919_488


def test_conv2d_fp32_is_priced_at_tf32_by_default():
    work = count_work(CONV2D, random_workload(CONV2D, N=8))
    flops = 2 * 8 * 128 * 56 * 56 * 64 * 3 * 3  # 2 N K H W C R R = 3_699_376_128 (bias not counted)
    moved = 4 * (8 * 64 * 56 * 56 + 128 * 64 * 9 + 128 + 8 * 128 * 56 * 56)  # 19_563_008
    assert work.matrix_flops == {Precision.FP32: flops} and work.bytes_moved == moved
    sol = estimate(work, GPU)
    assert sol.precision is Precision.TF32
    assert sol.t_sol_ms == pytest.approx(flops / 50e12 * 1e3) and sol.bound is Bound.MATRIX  # 0.0739875 ms
    cuda_cores = estimate(work, GPU, fp32_matmul=Precision.FP32)
    assert cuda_cores.t_sol_ms == pytest.approx(flops / 10e12 * 1e3)


# --- what counts as compulsory traffic -----------------------------------------------------------

def test_an_input_read_by_several_ops_or_broadcast_counts_once():
    definition = define({"n": None}, {"x": (["n"], "float32"), "s": (["1"], "float32")},
                        {"y": (["n"], "float32")},
                        "def run(x, s):\n    return x * x + x * s.expand(x.shape[0])\n")
    work = count_work(definition, random_workload(definition, n=1000))
    assert work.read_bytes == 4 * (1000 + 1) and work.write_bytes == 4 * 1000


def test_only_the_rows_a_gather_or_slice_touches_are_read():
    definition = define(
        {"t": None, "V": 100_000, "d": 256},
        {"ids": (["t"], "int64"), "table": (["V", "d"], "bfloat16"), "big": (["V", "d"], "bfloat16")},
        {"y": (["t", "d"], "bfloat16")},
        "import torch.nn.functional as F\n\ndef run(ids, table, big):\n"
        "    return F.embedding(ids, table) + big[:ids.shape[0]]\n")
    work = count_work(definition, random_workload(definition, t=32))
    assert work.read_bytes == 8 * 32 + 2 * 32 * 256 + 2 * 32 * 256  # ids, 32 gathered rows, a 32-row slice
    assert work.unread_inputs == ()


def test_halves_of_an_input_read_apart_add_up_to_the_whole():
    definition = define({"n": None}, {"x": (["n", "2"], "float32")}, {"y": (["n"], "float32")},
                        "def run(x):\n    return x[:, 0] * x[:, 1]\n")
    work = count_work(definition, random_workload(definition, n=100))
    assert work.read_bytes == 4 * 200


def test_huge_shapes_are_counted_without_allocating():
    work = count_work(GEMM, random_workload(GEMM, M=1 << 22))  # A alone would be 8 GiB
    assert work.total_matrix_flops == 2 * (1 << 22) * 512 * 1024
    assert work.counted_on == "meta"


def test_einsum_over_a_broadcast_operand_does_not_count_the_repeats():
    definition = define(
        {"b": None, "h": 16, "s": 64, "n": 32},
        {"C": (["b", "s", "n"], "bfloat16"), "B": (["b", "s", "n"], "bfloat16")},
        {"G": (["b", "h", "s", "s"], "bfloat16")},
        "import torch\n\ndef run(C, B):\n    h = 16\n"
        "    Ce = C[:, None].expand(-1, h, -1, -1)\n    Be = B[:, None].expand(-1, h, -1, -1)\n"
        "    return torch.einsum('bhin,bhjn->bhij', Ce, Be)\n")
    work = count_work(definition, random_workload(definition, b=2))
    assert work.total_matrix_flops == 2 * 2 * 64 * 64 * 32  # the same for every head: counted once


# --- custom inputs and fallbacks -----------------------------------------------------------------

CUSTOM = """
import torch

def make(axes, device):
    x = torch.randn(axes["n"], 64, device=device)
    scale = x.abs().max().item()  # real values needed: fails on meta
    return {"x": x, "scale": scale}

def run(x, scale):
    return x / scale
"""


def custom_definition(reference: str) -> tuple[Definition, Workload]:
    definition = define({"n": None}, {"x": (["n", "64"], "float32"), "scale": (None, "float32")},
                        {"y": (["n", "64"], "float32")}, reference, custom_inputs_entrypoint="make")
    workload = Workload.model_validate({"uuid": "w", "axes": {"n": 128},
                                        "inputs": {"x": {"type": "custom"}, "scale": {"type": "custom"}}})
    return definition, workload


def test_custom_inputs_made_on_cpu_when_meta_cannot_then_counted_on_meta():
    definition, workload = custom_definition(CUSTOM)
    work = count_work(definition, workload)
    assert work.counted_on == "meta" and work.bytes_moved == 4 * 2 * 128 * 64


def test_a_reference_that_needs_values_runs_on_cpu():
    definition, workload = custom_definition(CUSTOM.replace("return x / scale", "return x / x.max().item()"))
    work = count_work(definition, workload)
    assert work.counted_on == "cpu" and work.bytes_moved == 4 * 2 * 128 * 64


def test_the_cpu_fallback_has_a_budget():
    definition, workload = custom_definition(CUSTOM.replace("return x / scale", "return x / x.max().item()"))
    with pytest.raises(SolCountError, match="over the .* budget"):
        count_work(definition, workload, cpu_budget_bytes=1024)


def test_a_reference_that_runs_nowhere_is_reported():
    definition, workload = custom_definition(CUSTOM.replace("return x / scale", "raise RuntimeError('no')"))
    with pytest.raises(SolCountError, match="nor on CPU .*RuntimeError: no"):
        count_work(definition, workload)


def test_missing_safetensors_files_are_named(tmp_path: Path):
    definition = define({"n": None}, {"x": (["n"], "int32")}, {"y": (["n"], "int32")},
                        "def run(x):\n    return x + 1\n")
    workload = Workload.model_validate({"uuid": "w", "axes": {"n": 4}, "inputs": {
        "x": {"type": "safetensors", "path": "blob/x.safetensors", "tensor_key": "x"}}})
    with pytest.raises(SolCountError, match="blob/x.safetensors"):
        count_work(definition, workload, tmp_path)


# --- explicit formulas ---------------------------------------------------------------------------

GEMM_AXES = {"M": None, "N": 512, "K": 1024}
GEMM_IO = ({"A": (["M", "K"], "bfloat16"), "B": (["N", "K"], "bfloat16")}, {"C": (["M", "N"], "bfloat16")})


def test_formulas_replace_the_counted_work():
    definition = define(GEMM_AXES, *GEMM_IO, "def run(A, B):\n    raise RuntimeError('not run')\n",
                        sol={"flops": "2 * M * N * K", "bytes": "2 * (M * K + N * K + M * N)"})
    work = count_work(definition, random_workload(definition, M=256))
    assert work.counted_on == "formula"
    assert work.total_matrix_flops == 268_435_456 and work.bytes_moved == 1_835_008
    assert estimate(work, GPU).t_sol_ms == pytest.approx(0.00268435456)


def test_one_formula_and_the_other_counted():
    definition = define(GEMM_AXES, *GEMM_IO, "def run(A, B):\n    return A @ B.T\n",
                        sol={"bytes": "2 * M * N"})
    work = count_work(definition, random_workload(definition, M=256))
    assert work.counted_on == "meta+formula"
    assert work.bytes_moved == 2 * 256 * 512 and work.total_matrix_flops == 268_435_456


def test_formulas_may_take_min_and_max():
    definition = define(GEMM_AXES, *GEMM_IO, "def run(A, B):\n    return A @ B.T\n",
                        sol={"flops": "2 * M * N * K", "bytes": "2 * (min(M, 100) * K + max(N, 1) * K)"})
    work = count_work(definition, random_workload(definition, M=256))
    assert work.counted_on == "formula"
    assert work.bytes_moved == 2 * (100 * 1024 + 512 * 1024)


def test_a_formula_that_fails_on_a_workload_is_a_count_error():
    definition = define(GEMM_AXES, *GEMM_IO, "def run(A, B):\n    return A @ B.T\n",
                        sol={"flops": "2 * N * K // (M - 256)", "bytes": "N - M"})
    with pytest.raises(SolCountError, match="cannot be evaluated"):
        count_work(definition, random_workload(definition, M=256))
    with pytest.raises(SolCountError, match="negative work"):
        count_work(definition, random_workload(definition, M=1024))


@pytest.mark.parametrize(("formula", "message"), [
    ({"flops": "2 * M * Q"}, "undefined axis `Q`"),
    ({"bytes": "__import__('os')"}, "uses a call other than min"),
    ({"bytes": "min(M, key=N)"}, "uses a call other than min"),
    ({"flops": "2 *"}, "not an expression"),
    ({"typo": "1"}, "Extra inputs"),
])
def test_bad_formulas_are_format_errors(formula, message):
    data = GEMM.model_dump(exclude_none=True) | {"sol": formula}
    with pytest.raises(FormatError, match=message):
        parse_model(Definition, data, "definition.json")


# --- solar mode ----------------------------------------------------------------------------------

def test_solar_prices_fp32_at_16_bits_two_bytes_per_element_plus_the_floor():
    definition = define({"n": None}, {"a": (["n", "n"], "float32"), "b": (["n", "n"], "float32")},
                        {"c": (["n", "n"], "float32")}, "def run(a, b):\n    return a @ b\n")
    work = count_work(definition, random_workload(definition, n=1024), use_formulas=False)
    sol = estimate(work, B200_SOLAR_1500MHZ, SolMode.SOLAR)
    t_matrix = 2 * 1024**3 / (1811.253e12) * 1e3
    t_memory = 2 * 3 * 1024**2 / (7667.4e9) * 1e3
    assert sol.precision is Precision.FP16 and sol.bound is Bound.MATRIX
    assert sol.t_sol_ms == pytest.approx(max(t_matrix, t_memory) + SOLAR_LAUNCH_FLOOR_MS)


def test_solar_leaves_bool_masks_out_and_prices_fp8_problems_at_one_byte():
    definition = define({"n": None}, {"x": (["n"], "bfloat16"), "m": (["n"], "bool")}, {"y": (["n"], "bfloat16")},
                        "import torch\n\ndef run(x, m):\n"
                        "    return torch.where(m, x, 0).to(torch.float8_e4m3fn).to(x.dtype)\n")
    work = count_work(definition, random_workload(definition, n=1 << 20))
    assert work.bool_elements == 1 << 20
    sol = estimate(work, B200_SOLAR_1500MHZ, SolMode.SOLAR)
    assert sol.precision is Precision.FP8
    assert sol.bytes_moved == 2 * (1 << 20)  # x and y, one byte each; the mask is free


def test_hack_floor_is_below_every_estimate():
    work = count_work(CONV2D, random_workload(CONV2D, N=8))
    calibrated = GPU.with_calibration(900.0, {"bfloat16": 80.0})
    floor = hack_floor_ms(work, calibrated)
    assert floor == pytest.approx(3_699_376_128 / 100e12 * 1e3)  # fp32 at the 16-bit datasheet rate
    assert floor < estimate(work, calibrated).t_sol_ms


def test_hack_floor_leaves_out_the_writes_a_write_back_l2_can_hold():
    """Measured on an H100 (docs/results/2026-12-05-fidelity-h100.log): torch's add of 4M fp32
    elements took 14.24 us, faster than its 48 MiB of reads and writes at the datasheet's 3.35 TB/s
    (15.02 us): the 16 MiB written were still in the L2 when the kernel ended. The floor charges
    the reads, and only the writes beyond the L2."""
    from shared.hardware import lookup

    add = define({"n": None}, {"a": (["n"], "float32"), "b": (["n"], "float32")}, {"y": (["n"], "float32")},
                 "import torch\n\ndef run(a, b):\n    return a + b\n")
    h100 = lookup("NVIDIA H100 80GB HBM3")
    four_m = count_work(add, random_workload(add, n=1 << 22))
    assert hack_floor_ms(four_m, h100) == pytest.approx(2 * 4 * (1 << 22) / 3350e6)
    assert hack_floor_ms(four_m, h100) < 0.01424 < four_m.bytes_moved / 3350e6
    big = count_work(add, random_workload(add, n=1 << 26))  # 256 MiB written: 50 MiB may stay in the L2
    assert hack_floor_ms(big, h100) == pytest.approx((3 * 4 * (1 << 26) - 50 * 2**20) / 3350e6)
    unknown_l2 = HardwareSpec("no_l2", "No L2 figure", 3350.0, GPU.peaks, "test")
    assert hack_floor_ms(big, unknown_l2) == pytest.approx(2 * 4 * (1 << 26) / 3350e6)


# --- score ---------------------------------------------------------------------------------------

def test_score_anchors():
    assert sol_score(t_kernel_ms=2.0, t_baseline_ms=2.0, t_sol_ms=0.5).raw == pytest.approx(0.5)
    assert sol_score(0.5, 2.0, 0.5).raw == pytest.approx(1.0)
    assert sol_score(1.25, 2.0, 0.5).raw == pytest.approx(2 / 3)  # halfway from T_b to T_sol
    assert sol_score(1e6, 2.0, 0.5).display == pytest.approx(0.0, abs=1e-5)
    slower = sol_score(3.5, 2.0, 0.5)
    assert slower.raw == pytest.approx(1 / 3) and slower.display == slower.raw


def test_faster_than_light_keeps_the_raw_value_and_displays_one():
    beyond = sol_score(0.25, 2.0, 0.5)
    assert beyond.raw == pytest.approx(1.5 / 1.25) and beyond.display == 1.0
    assert sol_score(0.1, 0.6, 0.5).raw == math.inf  # past the formula's pole
    assert sol_score(0.1, 0.6, 0.5).display == 1.0


def test_degenerate_baseline_at_or_below_sol():
    assert sol_score(0.4, 0.5, 0.5) == sol_score(0.4, 0.4, 0.5)
    assert sol_score(0.5, 0.4, 0.5).display == 1.0 and sol_score(0.5, 0.4, 0.5).degenerate
    assert sol_score(0.6, 0.4, 0.5).display == 0.0


def test_non_positive_times_are_errors():
    with pytest.raises(ValueError):
        sol_score(0.0, 1.0, 0.5)


def test_trace_block_and_problem_score():
    sol = estimate(count_work(GEMM, random_workload(GEMM, M=256)), GPU)
    block = trace_sol(sol, t_kernel_ms=sol.t_sol_ms * 2, t_baseline_ms=sol.t_sol_ms * 2)
    assert block.score == pytest.approx(0.5) and block.bound == "matrix" and block.hardware == "Test GPU"
    assert problem_score([0.5, 1.0, 0.0]) == pytest.approx(0.5)


def test_campaign_figures():
    figures = campaign_figures([
        ProblemOutcome("a", speedup_over_baseline=4.0, speedup_over_eager=8.0, sol_score=0.9),
        ProblemOutcome("b", speedup_over_baseline=1.0, speedup_over_eager=2.0, sol_score=0.5),
        ProblemOutcome("c", speedup_over_baseline=1.5, speedup_over_eager=2.0, sol_score=0.6),
        ProblemOutcome("d", None, None, None),  # nothing passed yet
    ])
    assert (figures.problems, figures.solved) == (4, 3)
    assert figures.geomean_speedup_over_baseline == pytest.approx(6.0 ** (1 / 3))
    assert figures.geomean_speedup_over_eager == pytest.approx(32.0 ** (1 / 3))
    assert figures.share_beating_baseline == 0.5 and figures.share_above_2x == 0.25
    assert figures.median_sol_score == pytest.approx(0.6)
    assert problem_speedup([2.0, 8.0], [1.0, 1.0]) == pytest.approx(4.0)


def test_attention_counted_on_cpu_is_still_matrix_work():
    definition = define(ATTENTION_AXES, *ATTENTION_IO,
                        "import torch.nn.functional as F\n\ndef run(q, k, v):\n"
                        "    q = q * (1.0 + 0.0 * q.sum().item())  # needs values: meta cannot\n"
                        "    return F.scaled_dot_product_attention(q, k, v)\n")
    work = count_work(definition, random_workload(definition, B=1, L=64))
    assert work.counted_on == "cpu"
    assert work.total_matrix_flops == 4 * 1 * 8 * 64 * 64 * 64


def test_command_line_prints_every_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    import json

    from kernelswarm.cli import main

    (tmp_path / "definition.json").write_text(GEMM.model_dump_json(exclude_none=True))
    (tmp_path / "workload.jsonl").write_text("".join(
        json.dumps({"uuid": f"m{m}", "axes": {"M": m}, "inputs": {"A": {"type": "random"}, "B": {"type": "random"}}})
        + "\n" for m in (1, 256)))
    assert main(["sol", str(tmp_path), "--hardware", "NVIDIA H100 80GB HBM3", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["uuid"] for r in rows] == ["m1", "m256"] and rows[1]["matrix_flops"] == 268_435_456
    assert rows[0]["bound"] == "memory" and rows[0]["hardware"] == "H100 SXM"
    assert main(["sol", str(tmp_path), "--mode", "solar"]) == 0
    assert "B200 @ 1500 MHz (SOLAR)" in capsys.readouterr().out


def test_t_sol_is_priced_at_the_faster_of_the_datasheet_and_the_measured_ceiling_of_each_unit():
    """A calibration below the datasheet's bandwidth (HBM rarely reaches it) and above its bf16 rate
    (as cuBLAS on an H200, 813 TFLOP/s against a measured 772): T_sol takes the faster of each, so
    neither a memory-bound nor a matrix-bound honest kernel can beat it."""
    calibrated = GPU.with_calibration(800.0, {"bfloat16": 120.0})
    big = count_work(GEMM, random_workload(GEMM, M=8192))  # matrix-bound
    fastest, measured, datasheet = (estimate(big, calibrated, ceilings=c) for c in ("fastest", "measured", "datasheet"))
    assert fastest.matrix_tflops == 120.0 and fastest.bandwidth_gbps == 1000.0 and fastest.ceilings == "fastest"
    assert measured.matrix_tflops == 120.0 and measured.bandwidth_gbps == 800.0
    assert datasheet.matrix_tflops == 100.0 and datasheet.bandwidth_gbps == 1000.0
    assert fastest.t_sol_ms <= min(measured.t_sol_ms, datasheet.t_sol_ms)
    assert fastest.t_sol_ms == pytest.approx(big.total_matrix_flops / 120e9)
    small = count_work(GEMM, random_workload(GEMM, M=1))  # memory-bound: the datasheet's bandwidth
    assert estimate(small, calibrated).t_memory_ms == pytest.approx(small.bytes_moved / 1000e6)
    assert estimate(small, calibrated, ceilings="measured").t_memory_ms == pytest.approx(small.bytes_moved / 800e6)
    with pytest.raises(ValueError, match="ceilings"):
        estimate(small, calibrated, ceilings="best")

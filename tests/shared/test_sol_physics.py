"""Counting as physics (issue 29 item 2): every tensor at its dtype's real size, gathers charged
the rows or elements they touch, an output that is a view of an input read as well as written, and
a definition's `sol` formulas over axes and tensor sizes for a reference that does redundant work."""

from __future__ import annotations

import pytest

from shared.errors import FormatError
from shared.hardware import B200_SOLAR_1500MHZ
from shared.schema import Definition, Workload, parse_model
from shared.sol import SolMode, estimate
from shared.sol_count import count_work
from tests.shared.test_sol import GPU, define, random_workload

V, D, N = 1024, 256, 8  # a table of V rows of D fp32 values; N int64 indices
ROW_BYTES = D * 4
INDEX_BYTES = N * 8


def gather(expression: str, out_shape: list[str]) -> Definition:
    return define({"V": V, "D": D, "N": N}, {"t": (["V", "D"], "float32"), "i": (["N"], "int64")},
                  {"y": (out_shape, "float32")}, f"import torch\n\ndef run(t, i):\n    return {expression}\n")


@pytest.mark.parametrize(("expression", "out_shape", "table_bytes"), [
    ("torch.index_select(t, 0, i)", ["N", "D"], N * ROW_BYTES),
    ("torch.nn.functional.embedding(i, t)", ["N", "D"], N * ROW_BYTES),
    ("t[i]", ["N", "D"], N * ROW_BYTES),
    ("torch.gather(t, 0, i[:, None].expand(-1, t.shape[1]))", ["N", "D"], N * ROW_BYTES),
    ("torch.take(t, i)", ["N"], N * 4),
    ("t[i, :8]", ["N", "N"], N * 8 * 4),  # 8 of every row's 256 elements, of 8 rows
    ("t[:, i]", ["V", "N"], V * N * 4),  # 8 of every row's 256 elements, of every row
])
def test_a_gather_is_charged_what_it_touches_not_the_table(expression, out_shape, table_bytes):
    work = count_work(gather(expression, out_shape), random_workload(gather(expression, out_shape)))
    assert work.counted_on == "meta"
    assert work.read_bytes == table_bytes + INDEX_BYTES
    assert work.read_bytes < V * D * 4 / 3


def test_index_add_reads_the_source_rows_and_charges_the_output_once():
    definition = define({"V": V, "D": D, "N": N}, {"src": (["N", "D"], "float32"), "i": (["N"], "int64")},
                        {"y": (["V", "D"], "float32")},
                        "import torch\n\ndef run(src, i):\n"
                        "    return torch.zeros(1024, src.shape[1]).index_add_(0, i, src)\n")
    work = count_work(definition, random_workload(definition))
    assert work.read_bytes == N * ROW_BYTES + INDEX_BYTES and work.write_bytes == V * ROW_BYTES


@pytest.mark.parametrize("expression", ["t[::128]", "t.narrow(0, 0, 8)"])
def test_an_output_that_is_a_view_of_an_input_is_read_too(expression):
    work = count_work(gather(expression, ["N", "D"]), random_workload(gather(expression, ["N", "D"])))
    assert work.read_bytes == N * ROW_BYTES and work.write_bytes == N * ROW_BYTES


def test_fp32_tensors_count_four_bytes_in_physical_mode_and_two_in_solar_mode():
    definition = define({"n": None}, {"x": (["n"], "float32")}, {"y": (["n"], "float32")},
                        "import torch\n\ndef run(x):\n    return torch.nn.functional.gelu(x)\n")
    work = count_work(definition, random_workload(definition, n=1 << 20))
    assert work.bytes_moved == 2 * 4 * (1 << 20)
    assert estimate(work, GPU).t_memory_ms == pytest.approx(8 * (1 << 20) / 1e9)  # 1 TB/s
    assert estimate(work, B200_SOLAR_1500MHZ, SolMode.SOLAR).bytes_moved == 2 * 2 * (1 << 20)


# Two linear layers on the same input whose outputs are summed: x W1^T + x W2^T = x (W1 + W2)^T.
# The reference does both GEMMs; a kernel needs one (plus N*K adds), so the definition says so.
TWO_LINEARS = {"axes": {"M": None, "N": 512, "K": 1024},
               "inputs": {"x": (["M", "K"], "bfloat16"), "w1": (["N", "K"], "bfloat16"), "w2": (["N", "K"], "bfloat16")},
               "outputs": {"y": (["M", "N"], "bfloat16")},
               "reference": "def run(x, w1, w2):\n    return x @ w1.T + x @ w2.T\n"}


def two_linears(**extra) -> Definition:
    spec = TWO_LINEARS
    return define(spec["axes"], spec["inputs"], spec["outputs"], spec["reference"], **extra)


def test_a_formula_counts_the_work_a_kernel_needs_where_the_reference_repeats_it():
    counted = count_work(two_linears(), random_workload(two_linears(), M=256))
    assert counted.total_matrix_flops == 2 * (2 * 256 * 512 * 1024)  # two GEMMs, as written
    definition = two_linears(sol={"flops": "2 * M * N * K", "bytes": "nbytes(x) + nbytes(w1) + nbytes(w2) + nbytes(y)"})
    work = count_work(definition, random_workload(definition, M=256))
    assert work.counted_on == "formula" and work.total_matrix_flops == 2 * 256 * 512 * 1024
    assert work.bytes_moved == counted.bytes_moved == 2 * (256 * 1024 + 2 * 512 * 1024 + 256 * 512)


def test_itemsize_follows_the_declared_dtype():
    spec = dict(TWO_LINEARS, inputs={n: (s, "float32") for n, (s, _) in TWO_LINEARS["inputs"].items()})
    definition = define(spec["axes"], spec["inputs"], spec["outputs"], spec["reference"],
                        sol={"bytes": "(M * K + 2 * N * K) * itemsize(x) + nbytes(y)"})
    work = count_work(definition, random_workload(definition, M=256))
    assert work.counted_on == "meta+formula"
    assert work.bytes_moved == 4 * (256 * 1024 + 2 * 512 * 1024) + 2 * 256 * 512


@pytest.mark.parametrize(("formula", "message"), [
    ({"bytes": "nbytes(z)"}, "nbytes\\(TENSOR\\)"),  # not a tensor of the definition
    ({"bytes": "nbytes(x, y)"}, "nbytes\\(TENSOR\\)"),
    ({"bytes": "nbytes(M)"}, "nbytes\\(TENSOR\\)"),  # an axis, not a tensor
    ({"bytes": "x.nbytes"}, "Attribute"),
    ({"flops": "itemsize(x)"}, None),  # allowed
])
def test_tensor_sizes_in_formulas_are_checked_when_the_definition_loads(formula, message):
    data = two_linears().model_dump(exclude_none=True) | {"sol": formula}
    if message is None:
        assert parse_model(Definition, data, "definition.json").sol.flops == "itemsize(x)"
        return
    with pytest.raises(FormatError, match=message):
        parse_model(Definition, data, "definition.json")


def test_axis_expressions_may_not_use_tensor_sizes():
    data = two_linears().model_dump(exclude_none=True)
    data["axes"] = data["axes"] | {"B": {"type": "expr", "expression": "nbytes(x)"}}
    definition = parse_model(Definition, data, "definition.json")
    with pytest.raises(ValueError, match="a call other than min"):
        definition.resolve_axes({"M": 4})


def test_a_reference_that_makes_cuda_tensors_is_counted_on_fake_cuda_tensors_without_a_gpu():
    """Shapes only still: torch's FakeTensorMode makes "cuda" tensors on a machine without CUDA."""
    definition = define({"n": None}, {"a": (["n", "n"], "bfloat16")}, {"c": (["n", "n"], "bfloat16")},
                        "import torch\n\ndef run(a):\n    bias = torch.zeros(a.shape[1], device='cuda', dtype=a.dtype)\n"
                        "    return a.cuda() @ a.to('cuda').T + bias\n")
    work = count_work(definition, random_workload(definition, n=256), cpu_budget_bytes=0)  # no real values
    assert work.counted_on == "fake"
    assert work.total_matrix_flops == 2 * 256**3 and work.bytes_moved == 2 * 2 * 256 * 256


REPEATED_IDS = ("import torch\n\ndef make_inputs(axes, device):\n"
                "    ids = torch.arange(axes['N'], device=device) % 4  # 64 lookups of 4 distinct rows\n"
                "    return {'i': ids, 't': torch.randn(axes['V'], axes['D'], device=device)}\n\n"
                "def run(i, t):\n{check}    return torch.nn.functional.embedding(i, t)\n")


@pytest.mark.parametrize(("check", "rows", "counted_on"), [
    ("", 64, "meta"),  # no values: every lookup may be a row of its own
    ("    assert i.max().item() < t.shape[0]\n", 4, "cpu"),  # the problem's own ids: 4 distinct rows
])
def test_with_the_problems_own_index_values_a_gather_reads_each_distinct_row_once(check, rows, counted_on):
    definition = define({"V": V, "D": D, "N": 64}, {"i": (["N"], "int64"), "t": (["V", "D"], "float32")},
                        {"y": (["N", "D"], "float32")}, REPEATED_IDS.replace("{check}", check),
                        custom_inputs_entrypoint="make_inputs")
    workload = Workload.model_validate({"uuid": "w", "axes": {}, "inputs": {"i": {"type": "custom"},
                                                                          "t": {"type": "custom"}}})
    work = count_work(definition, workload)
    assert work.counted_on == counted_on
    assert work.read_bytes == rows * ROW_BYTES + 64 * 8


def test_our_own_zero_indices_do_not_shrink_a_gather():
    """Random integer inputs are zeros on the CPU: every lookup would hit row 0, which is not what
    the evaluator's inputs do, so the gather keeps its output's size."""
    definition = gather("torch.index_select(t, 0, i) * i.sum().item()", ["N", "D"])
    work = count_work(definition, random_workload(definition))
    assert work.counted_on == "cpu" and work.read_bytes == N * ROW_BYTES + INDEX_BYTES

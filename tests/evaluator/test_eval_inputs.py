"""inputs.make_inputs: one input set per seed, shaped and typed by the definition; scalars,
safetensors and custom inputs; clear errors for what cannot be made."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch
from safetensors.torch import save_file

from services.evaluator.harness.inputs import InputError, make_inputs, torch_dtype
from shared.schema import Definition, DType, Workload

CPU = torch.device("cpu")

MIXED = Definition.model_validate({
    "name": "mixed",
    "axes": {"n": {"type": "var"}, "d": {"type": "const", "value": 8}, "n2": {"type": "expr", "expression": "2 * n"}},
    "inputs": {
        "x": {"shape": ["n", "d"], "dtype": "float32"},
        "h": {"shape": ["n2"], "dtype": "bfloat16"},
        "f": {"shape": ["d"], "dtype": "float16"},
        "ids": {"shape": ["n"], "dtype": "int64"},
        "small": {"shape": ["d", "4"], "dtype": "int8"},
        "mask": {"shape": ["n"], "dtype": "bool"},
        "eps": {"shape": None, "dtype": "float32"},
    },
    "outputs": {"y": {"shape": ["n", "d"], "dtype": "float32"}},
    "reference": "def run(x, h, f, ids, small, mask, eps):\n    return x\n",
})
MIXED_WORKLOAD = Workload.model_validate({
    "uuid": "mixed-1", "axes": {"n": 5},
    "inputs": {**{n: {"type": "random"} for n in ("x", "h", "f", "ids", "small", "mask")},
               "eps": {"type": "scalar", "value": 1e-5}},
})

AFFINE = Definition.model_validate({
    "name": "affine",
    "axes": {"n": {"type": "var"}, "d": {"type": "const", "value": 64}},
    "inputs": {"x": {"shape": ["n", "d"], "dtype": "float32"}, "w": {"shape": ["d"], "dtype": "float32"},
               "b": {"shape": ["d"], "dtype": "float32"}},
    "outputs": {"y": {"shape": ["n", "d"], "dtype": "float32"}},
    "reference": "def run(x, w, b):\n    return x * w + b\n",
})


def affine_workload(n: int = 32, **inputs: dict) -> Workload:
    spec = {"x": {"type": "random"}, "w": {"type": "random"}, "b": {"type": "random"}, **inputs}
    return Workload.model_validate({"uuid": "affine", "axes": {"n": n}, "inputs": spec})


def test_shapes_dtypes_and_order_follow_the_definition() -> None:
    inputs = make_inputs(MIXED, MIXED_WORKLOAD, 1, CPU, None, None)
    assert list(inputs) == list(MIXED.inputs)
    expected = {"x": ((5, 8), torch.float32), "h": ((10,), torch.bfloat16), "f": ((8,), torch.float16),
                "ids": ((5,), torch.int64), "small": ((8, 4), torch.int8), "mask": ((5,), torch.bool)}
    for name, (shape, dtype) in expected.items():
        assert (tuple(inputs[name].shape), inputs[name].dtype) == (shape, dtype), name
        assert inputs[name].device == CPU
    assert inputs["eps"] == 1e-5  # scalars pass through as Python values
    assert isinstance(inputs["eps"], float)


def test_same_seed_same_inputs() -> None:
    a = make_inputs(MIXED, MIXED_WORKLOAD, 1234, CPU, None, None)
    b = make_inputs(MIXED, MIXED_WORKLOAD, 1234, CPU, None, None)
    for name in ("x", "h", "f", "ids", "small", "mask"):
        assert torch.equal(a[name], b[name]), name


def test_different_seeds_differ() -> None:
    a = make_inputs(MIXED, MIXED_WORKLOAD, 1, CPU, None, None)
    b = make_inputs(MIXED, MIXED_WORKLOAD, 2, CPU, None, None)
    for name in ("x", "h", "f", "ids", "small"):
        assert not torch.equal(a[name], b[name]), name


def test_tensors_of_one_set_are_independent_draws() -> None:
    inputs = make_inputs(AFFINE, affine_workload(), 7, CPU, None, None)
    assert not torch.equal(inputs["w"], inputs["b"])
    assert not torch.equal(inputs["x"][0], inputs["w"])


def test_weights_and_biases_are_random_normal_not_ones_or_zeros() -> None:
    inputs = make_inputs(AFFINE, affine_workload(n=64), 3, CPU, None, None)
    for name in ("w", "b"):
        values = inputs[name]
        assert values.unique().numel() == values.numel(), name
        assert not torch.all(values == 1) and not torch.all(values == 0)
    x = inputs["x"]
    assert abs(x.mean().item()) < 0.2 and 0.8 < x.std().item() < 1.2
    ints = make_inputs(MIXED, MIXED_WORKLOAD, 5, CPU, None, None)["small"]
    assert ints.min() >= -64 and ints.max() < 64 and ints.unique().numel() > 1


def test_safetensors_input_is_read_relative_to_the_problem(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    weight = torch.arange(64, dtype=torch.float32)
    save_file({"w": weight, "other": torch.zeros(1)}, str(tmp_path / "data" / "w.safetensors"))
    workload = affine_workload(w={"type": "safetensors", "path": "data/w.safetensors", "tensor_key": "w"})
    a = make_inputs(AFFINE, workload, 1, CPU, tmp_path, None)
    b = make_inputs(AFFINE, workload, 2, CPU, tmp_path, None)
    assert torch.equal(a["w"], weight) and torch.equal(b["w"], weight)
    assert not torch.equal(a["x"], b["x"])  # the random inputs still change with the seed


def test_missing_safetensors_file_names_the_path(tmp_path: Path) -> None:
    workload = affine_workload(w={"type": "safetensors", "path": "data/nowhere.safetensors", "tensor_key": "w"})
    with pytest.raises(InputError) as error:
        make_inputs(AFFINE, workload, 1, CPU, tmp_path, None)
    assert str(error.value) == (f"safetensors file not found: {tmp_path / 'data' / 'nowhere.safetensors'} "
                                "(workload input needs key 'w')")


def test_missing_safetensors_key(tmp_path: Path) -> None:
    save_file({"weight": torch.zeros(64)}, str(tmp_path / "w.safetensors"))
    workload = affine_workload(w={"type": "safetensors", "path": "w.safetensors", "tensor_key": "w"})
    with pytest.raises(InputError, match=r"w.safetensors has no tensor 'w'"):
        make_inputs(AFFINE, workload, 1, CPU, tmp_path, None)


def test_random_input_for_a_scalar_is_an_error() -> None:
    data = MIXED_WORKLOAD.model_dump(mode="json")
    workload = Workload.model_validate({**data, "inputs": {**data["inputs"], "eps": {"type": "random"}}})
    with pytest.raises(InputError, match="input `eps` is a scalar"):
        make_inputs(MIXED, workload, 1, CPU, None, None)


def test_dtype_torch_cannot_make_is_an_input_error() -> None:
    with pytest.raises(InputError, match="dtype float4_e2m1 is not supported"):
        torch_dtype(DType.FLOAT4_E2M1)


# --- custom inputs ----------------------------------------------------------------------------------

CUSTOM_REFERENCE = """
import torch

def get_inputs(axes, device):
    n = axes["n"]
    return {"idx": torch.randint(0, 10, (n,), device=device), "table": torch.randn(10, 4, device=device)}

def not_a_dict(axes, device):
    return [1, 2]

def too_few(axes, device):
    return {"idx": torch.zeros(axes["n"], dtype=torch.int64)}

def run(idx, table):
    return table[idx]
"""


def custom(entry: str) -> tuple[Definition, Workload, ModuleType]:
    definition = Definition.model_validate({
        "name": "gather",
        "axes": {"n": {"type": "var"}},
        "custom_inputs_entrypoint": entry,
        "inputs": {"idx": {"shape": ["n"], "dtype": "int64"}, "table": {"shape": ["10", "4"], "dtype": "float32"}},
        "outputs": {"y": {"shape": ["n", "4"], "dtype": "float32"}},
        "reference": CUSTOM_REFERENCE,
    })
    workload = Workload.model_validate({"uuid": "g", "axes": {"n": 6},
                                        "inputs": {"idx": {"type": "custom"}, "table": {"type": "custom"}}})
    module = ModuleType("custom_reference")
    exec(compile(CUSTOM_REFERENCE, "<reference>", "exec"), module.__dict__)  # noqa: S102
    return definition, workload, module


def test_custom_inputs_come_from_the_reference_and_follow_the_seed() -> None:
    definition, workload, module = custom("get_inputs")
    a = make_inputs(definition, workload, 11, CPU, None, module)
    again = make_inputs(definition, workload, 11, CPU, None, module)
    other = make_inputs(definition, workload, 12, CPU, None, module)
    assert list(a) == ["idx", "table"]
    assert a["idx"].shape == (6,) and a["table"].shape == (10, 4)
    assert torch.equal(a["table"], again["table"]) and torch.equal(a["idx"], again["idx"])
    assert not torch.equal(a["table"], other["table"])


@pytest.mark.parametrize(("entry", "message"), [
    ("not_a_dict", "not_a_dict returned list, not a dict of inputs"),
    ("too_few", r"too_few did not produce inputs \['table'\]"),
])
def test_bad_custom_inputs(entry: str, message: str) -> None:
    definition, workload, module = custom(entry)
    with pytest.raises(InputError, match=message):
        make_inputs(definition, workload, 1, CPU, None, module)


def test_custom_inputs_need_the_reference() -> None:
    definition, workload, _ = custom("get_inputs")
    with pytest.raises(InputError, match="custom inputs need the reference function 'get_inputs'"):
        make_inputs(definition, workload, 1, CPU, None, None)

"""Input and output sets between the evaluator's processes: what is saved loads back bit for bit,
whatever the dtype, layout or sharing, and the file is one the safetensors library itself reads."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors import safe_open

from services.evaluator import tensorfile
from services.evaluator.tensorfile import NotATensor

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int8,
          torch.uint8, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2]


def random_of(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    bits = torch.randint(0, 256, (*shape, dtype.itemsize), dtype=torch.uint8)
    if dtype is torch.bool:
        return bits[..., 0] % 2 == 1
    return bits.view(dtype).reshape(shape)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8),
                                                                   b.reshape(-1).view(torch.uint8))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_round_trips_bit_for_bit(tmp_path, dtype):
    values = {"x": random_of(dtype, (3, 5, 7)), "empty": random_of(dtype, (0, 4)), "one": random_of(dtype, ())}
    tensorfile.save(values, tmp_path / "set.st")
    loaded = tensorfile.load(tmp_path / "set.st")
    assert list(loaded) == list(values)
    for name, value in values.items():
        assert same_bits(loaded[name], value), name


def test_fp4_pairs_round_trip(tmp_path):
    if not hasattr(torch, "float4_e2m1fn_x2"):
        pytest.skip("this torch has no float4_e2m1fn_x2")
    packed = random_of(torch.uint8, (4, 8)).view(torch.float4_e2m1fn_x2)
    tensorfile.save({"w": packed}, tmp_path / "fp4.st")
    assert same_bits(tensorfile.load(tmp_path / "fp4.st")["w"], packed)


def test_views_shared_storage_and_non_contiguous_layouts(tmp_path):
    base = torch.randn(6, 8)
    values = {"t": base.t(), "slice": base[2:4, 1::2], "again": base, "alias": base}
    tensorfile.save(values, tmp_path / "views.st")
    loaded = tensorfile.load(tmp_path / "views.st")
    for name, value in values.items():
        assert same_bits(loaded[name], value.contiguous()), name
    loaded["again"].add_(1)  # loaded tensors own their memory: no aliasing survives the trip
    assert torch.equal(loaded["alias"], base)


def test_scalars_none_and_other_values_travel_in_the_header(tmp_path):
    values = {"eps": 1e-6, "k": 3, "flag": True, "nothing": None, "x": torch.ones(2), "weird": object()}
    tensorfile.save(values, tmp_path / "mixed.st")
    loaded = tensorfile.load(tmp_path / "mixed.st")
    assert [loaded[k] for k in ("eps", "k", "flag", "nothing")] == [1e-6, 3, True, None]
    assert isinstance(loaded["weird"], NotATensor) and loaded["weird"].type_name == "object"
    assert torch.equal(loaded["x"], torch.ones(2))


def test_the_file_is_plain_safetensors_with_aligned_data(tmp_path):
    values = {"a": torch.arange(5, dtype=torch.int16), "b": torch.randn(3)}
    tensorfile.save(values, tmp_path / "plain.st")
    raw = (tmp_path / "plain.st").read_bytes()
    length = struct.unpack("<Q", raw[:8])[0]
    assert length % 8 == 0
    header = json.loads(raw[8:8 + length])
    assert header["a"]["data_offsets"] == [0, 10] and header["b"]["data_offsets"] == [10, 22]
    assert len(raw) == 8 + length + 22
    with safe_open(str(tmp_path / "plain.st"), framework="pt") as handle:  # the library's own reader
        assert torch.equal(handle.get_tensor("a").view(torch.int16), values["a"])
        assert json.loads(handle.metadata()["kernelswarm"])["b"] == {"kind": "tensor", "dtype": "float32",
                                                                      "shape": [3]}

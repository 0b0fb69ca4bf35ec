"""Input and output sets between the evaluator's processes: what is saved loads back bit for bit,
whatever the dtype, layout or sharing, and the file is one the safetensors library itself reads:
byte for byte the file its own `save_file` wrote before `tensorfile.save` wrote it itself. Every
round trip runs both ways a tensor is written: straight from its memory (a CPU tensor) and in
chunks through the staging buffer (a GPU tensor; `stage_all` sends CPU tensors that way here)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from services.evaluator.harness import tensorfile
from services.evaluator.harness.guards import Guard
from services.evaluator.harness.inputs import TORCH_DTYPES
from services.evaluator.harness.tensorfile import NotATensor

WRITES = pytest.mark.parametrize("stage_all", [False, True], ids=["direct", "staged"])


@pytest.fixture(autouse=True)
def fresh_stage(monkeypatch):
    """No staging buffer left over from another test."""
    monkeypatch.setattr(tensorfile, "_STAGING", {})


def random_of(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    bits = torch.randint(0, 256, (*shape, dtype.itemsize), dtype=torch.uint8)
    if dtype is torch.bool:
        return bits[..., 0] % 2 == 1
    return bits.view(dtype).reshape(shape)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bytes, whatever either's layout."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                                                                   b.contiguous().reshape(-1).view(torch.uint8))


def save_file_way(values: dict[str, Any], path: Path) -> None:
    """`tensorfile.save` as it was, through safetensors' `save_file` (which refuses shared memory)."""
    tensors: dict[str, torch.Tensor] = {}
    layout: dict[str, dict[str, Any]] = {}
    seen: set[int] = set()
    for name, value in values.items():
        if isinstance(value, torch.Tensor):
            flat = value.detach().contiguous().reshape(-1)
            if flat.untyped_storage().data_ptr() in seen or flat.data_ptr() != flat.untyped_storage().data_ptr():
                flat = flat.clone()
            seen.add(flat.untyped_storage().data_ptr())
            tensors[name] = flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)
            layout[name] = {"kind": "tensor", "dtype": str(value.dtype).removeprefix("torch."),
                            "shape": list(value.shape)}
        elif value is None or isinstance(value, (bool, int, float)):
            layout[name] = {"kind": "scalar", "value": value}
        else:
            layout[name] = {"kind": "other", "type": type(value).__name__}
    save_file(tensors, str(path), metadata={"kernelswarm": json.dumps(layout)})


def assert_round_trip(values: dict[str, Any], path: Path) -> None:
    """`values` as saved at `path` come back bit for bit through `load`, through `loads` of the
    file's bytes (the outer clock's sealed copies) and through safetensors' reader."""
    loaded = tensorfile.load(path)
    assert list(loaded) == list(values)
    from_bytes = tensorfile.loads(bytearray(path.read_bytes()))
    assert list(from_bytes) == list(values)
    for name, value in values.items():
        if isinstance(value, torch.Tensor):
            assert same_bits(from_bytes[name], value) and from_bytes[name].shape == value.shape, name
    with safe_open(str(path), framework="pt") as handle:
        layout = json.loads(handle.metadata()["kernelswarm"])
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                assert same_bits(loaded[name], value), name
                raw = handle.get_tensor(name).view(getattr(torch, layout[name]["dtype"])).reshape(value.shape)
                assert same_bits(raw, value), name


@WRITES
@pytest.mark.parametrize("dtype", list(TORCH_DTYPES.values()), ids=str)
def test_every_dtype_round_trips_bit_for_bit(tmp_path, dtype, stage_all):
    values = {"x": random_of(dtype, (3, 5, 7)), "empty": random_of(dtype, (0, 4)), "one": random_of(dtype, ()),
              "strided": random_of(dtype, (6, 10))[1::2, ::3]}
    tensorfile.save(values, tmp_path / "set.st", stage_all=stage_all)
    assert_round_trip(values, tmp_path / "set.st")


def test_fp4_pairs_round_trip(tmp_path):
    if not hasattr(torch, "float4_e2m1fn_x2"):
        pytest.skip("this torch has no float4_e2m1fn_x2")
    packed = random_of(torch.uint8, (4, 8)).view(torch.float4_e2m1fn_x2)
    tensorfile.save({"w": packed}, tmp_path / "fp4.st")
    assert same_bits(tensorfile.load(tmp_path / "fp4.st")["w"], packed)


@WRITES
def test_views_shared_storage_and_non_contiguous_layouts(tmp_path, stage_all):
    base = torch.randn(6, 8)
    values = {"t": base.t(), "slice": base[2:4, 1::2], "again": base, "alias": base, "tail": base[3:],
              "row": base[5], "element": base[1, 2], "bytes": base[1:3].view(torch.uint8)}
    assert values["tail"].is_contiguous() and values["tail"].storage_offset() == 24
    tensorfile.save(values, tmp_path / "views.st", stage_all=stage_all)
    assert_round_trip(values, tmp_path / "views.st")
    loaded = tensorfile.load(tmp_path / "views.st")
    loaded["again"].add_(1)  # loaded tensors own their memory: no aliasing survives the trip
    assert torch.equal(loaded["alias"], base)


@WRITES
def test_scalars_none_and_other_values_travel_in_the_header(tmp_path, stage_all):
    values = {"eps": 1e-6, "k": 3, "flag": True, "nothing": None, "x": torch.ones(2), "weird": object()}
    tensorfile.save(values, tmp_path / "mixed.st", stage_all=stage_all)
    for loaded in (tensorfile.load(tmp_path / "mixed.st"), tensorfile.loads((tmp_path / "mixed.st").read_bytes())):
        assert [loaded[k] for k in ("eps", "k", "flag", "nothing")] == [1e-6, 3, True, None]
        assert isinstance(loaded["weird"], NotATensor) and loaded["weird"].type_name == "object"
        assert torch.equal(loaded["x"], torch.ones(2))


def test_a_set_without_tensors_is_a_header_alone(tmp_path):
    tensorfile.save({"k": 3, "nothing": None}, tmp_path / "header.st")
    assert tensorfile.load(tmp_path / "header.st") == {"k": 3, "nothing": None}


def test_the_file_is_plain_safetensors_with_aligned_data(tmp_path):
    values = {"b": torch.randn(3), "a": torch.arange(5, dtype=torch.int16)}
    tensorfile.save(values, tmp_path / "plain.st")
    raw = (tmp_path / "plain.st").read_bytes()
    length = struct.unpack("<Q", raw[:8])[0]
    assert length % 8 == 0
    header = json.loads(raw[8:8 + length])
    assert list(header) == ["__metadata__", "a", "b"]  # safetensors' order: by name
    assert header["a"] == {"dtype": "U8", "shape": [10], "data_offsets": [0, 10]}
    assert header["b"] == {"dtype": "U8", "shape": [12], "data_offsets": [10, 22]}
    assert raw[8 + length:] == values["a"].numpy().tobytes() + values["b"].numpy().tobytes()
    with safe_open(str(tmp_path / "plain.st"), framework="pt") as handle:  # the library's own reader
        assert torch.equal(handle.get_tensor("a").view(torch.int16), values["a"])
        assert json.loads(handle.metadata()["kernelswarm"])["b"] == {"kind": "tensor", "dtype": "float32",
                                                                      "shape": [3]}


@WRITES
def test_the_same_bytes_as_safetensors_own_writer(tmp_path, stage_all):
    base = torch.randn(4, 6)
    values = {"zeta": base.t(), "Alpha": base[1:3], "base": base, "half": torch.arange(7, dtype=torch.float16),
              "none": torch.empty(0, 3), "scalar": torch.tensor(2.5, dtype=torch.bfloat16), "eps": 1e-5,
              "nothing": None, "odd": object(), "naïve": torch.ones(3, dtype=torch.bool)}
    save_file_way(values, tmp_path / "theirs.st")
    tensorfile.save(values, tmp_path / "ours.st", stage_all=stage_all)
    assert (tmp_path / "ours.st").read_bytes() == (tmp_path / "theirs.st").read_bytes()


def test_a_file_written_by_save_file_still_loads(tmp_path):
    base = torch.randn(5, 3)
    values = {"x": base, "view": base[1:].t(), "k": 3, "i8": random_of(torch.int8, (2, 2)), "odd": object()}
    save_file_way(values, tmp_path / "old.st")
    loaded = tensorfile.load(tmp_path / "old.st")
    assert same_bits(loaded["x"], base) and same_bits(loaded["view"], base[1:].t().contiguous())
    assert same_bits(loaded["i8"], values["i8"]) and loaded["k"] == 3 and isinstance(loaded["odd"], NotATensor)


def test_tensors_larger_than_the_staging_buffer_go_in_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(tensorfile, "STAGE_BYTES", 64)
    values = {"big": random_of(torch.float32, (251,)), "exact": random_of(torch.int64, (16,)),
              "small": random_of(torch.int8, (5,)), "strided": random_of(torch.bfloat16, (40, 9))[::3, 1:]}
    tensorfile.save(values, tmp_path / "chunks.st", stage_all=True)
    assert tensorfile._STAGING["buffer"].numel() == 64  # the chunks really were 64 bytes
    assert_round_trip(values, tmp_path / "chunks.st")
    save_file_way(values, tmp_path / "theirs.st")
    assert (tmp_path / "chunks.st").read_bytes() == (tmp_path / "theirs.st").read_bytes()


def test_the_staging_buffer_is_made_once_no_larger_than_needed(tmp_path):
    tensorfile.save({"x": torch.ones(10)}, tmp_path / "a.st", stage_all=True)
    first = tensorfile._STAGING["buffer"]
    assert first.numel() == 40  # smaller than STAGE_BYTES: the set is smaller
    tensorfile.save({"y": torch.ones(3), "z": torch.ones(4)}, tmp_path / "b.st", stage_all=True)
    assert tensorfile._STAGING["buffer"] is first
    tensorfile.save({"x": torch.ones(100)}, tmp_path / "c.st", stage_all=True)
    assert tensorfile._STAGING["buffer"].numel() == 400
    assert same_bits(tensorfile.load(tmp_path / "b.st")["z"], torch.ones(4))


def test_a_substituted_staging_buffer_is_not_used(tmp_path):
    class Sly(torch.Tensor):
        pass

    planted = torch.zeros(1 << 10, dtype=torch.uint8).as_subclass(Sly)
    tensorfile._STAGING["buffer"] = planted
    values = {"x": torch.randn(8)}
    tensorfile.save(values, tmp_path / "set.st", stage_all=True)
    assert tensorfile._STAGING["buffer"] is not planted
    assert_round_trip(values, tmp_path / "set.st")


def test_making_the_staging_buffer_does_not_trip_the_guard(tmp_path):
    guard = Guard()  # as in the candidate's process, before its first outputs are saved
    tensorfile.save({"y": torch.randn(16)}, tmp_path / "out.st", stage_all=True)
    assert "buffer" in tensorfile._STAGING
    assert guard.check() is None

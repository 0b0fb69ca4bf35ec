"""Tensor sets between the evaluator's processes: one safetensors file per set.

Every tensor travels as raw bytes (so any dtype does, FP4 included) with its dtype and shape in the
header; scalars and None travel in the header too; anything else arrives as `NotATensor`, which
the correctness check rejects by name. Loading maps the file and copies straight to the device.

Saving writes the safetensors layout itself (8-byte little-endian header length, the JSON header
padded with spaces to a multiple of 8, then each tensor's bytes in header order, which is by name),
byte for byte what `safetensors.torch.save_file` writes for the same set, without its copies: a CPU
tensor's bytes go from its own memory to the file, and a GPU tensor's pass through one pinned
staging buffer of at most `STAGE_BYTES`, a chunk at a time, so host memory stays bounded whatever
the tensor's size. (`save_file` copies a GPU tensor whole into pageable host memory first, and its
older releases then into a bytes object too: 0.7 GB/s on the H200, seconds per attempt.) Tensors
sharing memory need no copies either: each is written as its own bytes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch
from safetensors import safe_open

log = logging.getLogger(__name__)

STAGE_BYTES = 64 << 20  # the most host memory a GPU tensor's bytes pass through on their way to the file
_META = "kernelswarm"
# The staging buffer, made on the first save that needs one (one save at a time: the evaluator's
# children are single-threaded). Filled in place, never rebound: the guard in the candidate's
# process takes any rebound name of this module for the solution's doing.
_STAGING: dict[str, torch.Tensor] = {}


class NotATensor:
    """What a value that is neither a tensor nor a scalar becomes after the trip."""

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name

    def __repr__(self) -> str:
        return f"<{self.type_name}>"


def save(values: dict[str, Any], path: Path, *, stage_all: bool = False) -> None:
    """Write `values` to `path`. Tensors may share memory or be views of any layout: each is
    written as its own contiguous bytes. `stage_all` sends CPU tensors through the staging buffer
    too (the tests do, to exercise the chunks a GPU tensor is written in)."""
    layout: dict[str, dict[str, Any]] = {}
    tensors: dict[str, torch.Tensor] = {}
    for name, value in values.items():
        if isinstance(value, torch.Tensor):
            tensors[name] = value
            layout[name] = {"kind": "tensor", "dtype": str(value.dtype).removeprefix("torch."),
                            "shape": list(value.shape)}
        elif value is None or isinstance(value, (bool, int, float)):
            layout[name] = {"kind": "scalar", "value": value}
        else:
            layout[name] = {"kind": "other", "type": type(value).__name__}
    names = sorted(tensors)  # safetensors' order (by dtype, all U8 here, then name): the same file as save_file's
    sizes = [tensors[n].numel() * tensors[n].element_size() for n in names]
    staged = {n for n in names if stage_all or tensors[n].device.type != "cpu"}
    largest = max((size for n, size in zip(names, sizes) if n in staged), default=0)
    stage = _stage(min(STAGE_BYTES, largest)) if largest else None
    with open(path, "wb") as file:
        file.write(_header(layout, names, sizes))
        for name in names:
            raw = _bytes_of(tensors[name])
            if not raw.numel():
                continue
            if name in staged:
                _write_staged(file, raw, stage)
            else:
                file.write(memoryview(raw.numpy()))


def _header(layout: dict[str, dict[str, Any]], names: list[str], sizes: list[int]) -> bytes:
    """The length and the JSON header, laid out as safetensors' own writer lays them out."""
    header: dict[str, Any] = {"__metadata__": {_META: json.dumps(layout)}}
    offset = 0
    for name, size in zip(names, sizes):
        header[name] = {"dtype": "U8", "shape": [size], "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    encoded += b" " * (-len(encoded) % 8)
    return len(encoded).to_bytes(8, "little") + encoded


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's elements in row-major order as flat uint8, a view of its memory when it is
    contiguous (an offset into shared storage included), a copy on its own device otherwise."""
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)


def _stage(nbytes: int) -> torch.Tensor:
    """A host buffer of at least `nbytes`, pinned where the machine can pin, reused from save to save.
    Only a plain uint8 CPU tensor is reused: a subclass planted in its place by the solution (to
    produce its outputs at write time, untimed) is replaced, not written from."""
    buffer = _STAGING.get("buffer")
    if type(buffer) is torch.Tensor and buffer.dtype == torch.uint8 and buffer.device.type == "cpu" \
            and buffer.numel() >= nbytes:
        return buffer
    try:
        buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    except RuntimeError as error:  # no accelerator, or no page-locked memory left
        log.warning("staging buffer of %d bytes is pageable: pinning failed: %s", nbytes, error)
        buffer = torch.empty(nbytes, dtype=torch.uint8)
    _STAGING["buffer"] = buffer
    return buffer


def _write_staged(file: BinaryIO, raw: torch.Tensor, stage: torch.Tensor) -> None:
    """`raw`'s bytes through `stage`, `STAGE_BYTES` at most a chunk (each copy done before its write)."""
    chunk = min(STAGE_BYTES, stage.numel())
    for start in range(0, raw.numel(), chunk):
        part = stage.narrow(0, 0, min(chunk, raw.numel() - start))
        part.copy_(raw.narrow(0, start, part.numel()), non_blocking=False)
        file.write(memoryview(part.numpy()))


def loads(data: bytes | bytearray, device: torch.device | str = "cpu", header_only: bool = False) -> dict[str, Any]:
    """`load` of a set file's bytes held in memory (the outer clock's sealed copies): each tensor a
    view of `data` where it lies (on the CPU no copy is made; keep `data` alive). With
    `header_only` (`data` is the file's beginning up to its header's end), each tensor is an empty
    one on the meta device with the shape and dtype the header gives."""
    if isinstance(data, bytes) and not header_only:
        data = bytearray(data)  # torch views only writable buffers without a warning
    size = int.from_bytes(data[:8], "little")
    header = json.loads(bytes(data[8:8 + size]))

    def raw_of(name: str, entry: dict[str, Any]) -> torch.Tensor:
        if header_only:
            return torch.empty(entry["shape"], dtype=getattr(torch, entry["dtype"]), device="meta")
        begin, end = (8 + size + int(o) for o in header[name]["data_offsets"])
        if not 8 + size <= begin <= end <= len(data):
            raise ValueError(f"tensor {name!r} lies outside the file")
        raw = torch.frombuffer(data, dtype=torch.uint8, count=end - begin, offset=begin) if end > begin \
            else torch.empty(0, dtype=torch.uint8)
        if begin % 16:  # not aligned for a view as a wider dtype: a copy of its own
            raw = raw.clone()
        return raw.to(device)

    return _values(json.loads(header["__metadata__"][_META]), raw_of)


def load(path: Path, device: torch.device | str = "cpu") -> dict[str, Any]:
    with safe_open(str(path), framework="pt", device=str(device)) as handle:
        return _values(json.loads(handle.metadata()[_META]), lambda name, entry: handle.get_tensor(name))


def _values(layout: dict[str, dict[str, Any]],
            raw_of: Callable[[str, dict[str, Any]], torch.Tensor]) -> dict[str, Any]:
    """The set a header's layout describes: each tensor `raw_of(name, entry)` (its bytes, or a
    tensor of the right dtype already) seen as its dtype and shape; scalars from the header."""
    values: dict[str, Any] = {}
    for name, entry in layout.items():
        if entry["kind"] == "tensor":
            values[name] = raw_of(name, entry).view(getattr(torch, entry["dtype"])).reshape(entry["shape"])
        elif entry["kind"] == "scalar":
            values[name] = entry["value"]
        else:
            values[name] = NotATensor(entry["type"])
    return values

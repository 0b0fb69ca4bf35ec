"""Tensor sets between the evaluator's processes: one safetensors file per set.

Every tensor travels as raw bytes (so any dtype does, FP4 included) with its dtype and shape in the
header; scalars and None travel in the header too; anything else arrives as `NotATensor`, which
the correctness check rejects by name. Loading maps the file and copies straight to the device.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

_META = "kernelswarm"


class NotATensor:
    """What a value that is neither a tensor nor a scalar becomes after the trip."""

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name

    def __repr__(self) -> str:
        return f"<{self.type_name}>"


def save(values: dict[str, Any], path: Path) -> None:
    tensors: dict[str, torch.Tensor] = {}
    layout: dict[str, dict[str, Any]] = {}
    seen: set[int] = set()
    for name, value in values.items():
        if isinstance(value, torch.Tensor):
            flat = value.detach().contiguous().reshape(-1)
            if flat.untyped_storage().data_ptr() in seen or flat.data_ptr() != flat.untyped_storage().data_ptr():
                flat = flat.clone()  # safetensors refuses tensors that share memory
            seen.add(flat.untyped_storage().data_ptr())
            tensors[name] = flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)
            layout[name] = {"kind": "tensor", "dtype": str(value.dtype).removeprefix("torch."),
                            "shape": list(value.shape)}
        elif value is None or isinstance(value, (bool, int, float)):
            layout[name] = {"kind": "scalar", "value": value}
        else:
            layout[name] = {"kind": "other", "type": type(value).__name__}
    save_file(tensors, str(path), metadata={_META: json.dumps(layout)})


def load(path: Path, device: torch.device | str = "cpu") -> dict[str, Any]:
    values: dict[str, Any] = {}
    with safe_open(str(path), framework="pt", device=str(device)) as handle:
        layout = json.loads(handle.metadata()[_META])
        for name, entry in layout.items():
            if entry["kind"] == "tensor":
                raw = handle.get_tensor(name)
                values[name] = raw.view(getattr(torch, entry["dtype"])).reshape(entry["shape"])
            elif entry["kind"] == "scalar":
                values[name] = entry["value"]
            else:
                values[name] = NotATensor(entry["type"])
    return values

"""Output sets from the candidate to the checker in GPU memory (CUDA IPC) instead of files.

On a GPU with the outer clock on, the candidate's harness keeps each output set of a workload on
the device and, once its timed batch is done and the device synchronized, exports a handle to
every output tensor's allocation (`export_set`: `cudaIpcGetMemHandle` on the allocation's base, the
tensor's offset in it) and sends them with its `end`; it then waits for the evaluator's `sealed`
before it lets any of them go. The checker (the reference's process, trusted and disposable)
opens each allocation once, copies the bytes into tensors of its own, closes the handles, and
checks the copies (`Importer`). The untrusted process is the exporter, so it could free memory the
checker has open (undefined in CUDA): only the disposable checker is exposed, never the evaluator,
and the harness's wait keeps honest candidates from doing so.

A set that cannot be exported (a tensor not in device memory, an allocation IPC cannot share, no
cuda-python) is saved to its file as before; the checker reads those from the file. Measured on
the H200 (bench/cuda_ipc_probe.py, 1.67 GiB in 256 sets): 1.3 ms to export and 14 ms to open, copy
and close, against 0.96 s to save and 0.68 s to load through files.
"""

from __future__ import annotations

from typing import Any

import torch

from services.evaluator.harness import timing
from services.evaluator.harness.correctness import Check
from shared.schema import Status, Tolerance

def bind(device: torch.device) -> bool:
    """cuda-python on `device` (the binding the timer resets L2 with); False where it is missing (files then)."""
    timing.bind_runtime(device)
    return bound() is not None


def bound() -> tuple[Any, Any] | None:
    return timing.cuda_bindings()


def export_set(outputs: dict[str, Any], device: torch.device) -> tuple[dict[str, Any], list[torch.Tensor]] | None:
    """The descriptor of an output set (each tensor's allocation handle, offset, bytes, dtype and
    shape; scalars by value) and the tensors that must stay alive until the checker has copied
    them; None where any tensor cannot be shared (the set then goes through its file). Call after
    the device is synchronized."""
    cuda = bound()
    if cuda is None:
        return None
    driver, runtime = cuda
    tensors: dict[str, Any] = {}
    scalars: dict[str, Any] = {}
    keep: list[torch.Tensor] = []
    for name, value in outputs.items():
        if not isinstance(value, torch.Tensor):
            if value is None or isinstance(value, (bool, int, float)):
                scalars[name] = value
                continue
            return None  # the file says what it is (`NotATensor`)
        if value.device != device or type(value) is not torch.Tensor:
            return None
        flat = value.detach().contiguous().reshape(-1)
        raw = flat.view(torch.uint8) if flat.numel() else None
        entry: dict[str, Any] = {"dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape),
                                 "nbytes": 0 if raw is None else raw.numel()}
        if raw is not None:
            error, base, _size = driver.cuMemGetAddressRange(raw.data_ptr())
            if error != driver.CUresult.CUDA_SUCCESS:
                return None
            error, handle = runtime.cudaIpcGetMemHandle(int(base))
            if error != runtime.cudaError_t.cudaSuccess:
                return None
            entry.update(handle=bytes(handle.reserved).hex(), offset=raw.data_ptr() - int(base))
            keep.append(raw)
        tensors[name] = entry
    return {"tensors": tensors, "scalars": scalars}, keep


class Importer:
    """The checker's side: each allocation opened once (a second open in one context fails), its
    ranges copied into tensors of this process, every handle closed by `close`."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._opened: dict[str, tuple[int, int | None]] = {}  # handle -> (pointer, allocation size if known)

    def load(self, descriptor: dict[str, Any], expected: dict[str, Any]) -> dict[str, Any] | Check:
        """The set as tensors of this process (copies), or the Check that stops it: a shape or
        dtype the expected outputs do not have is said by name before anything is copied."""
        from services.evaluator.harness.correctness import compare

        values: dict[str, Any] = dict(descriptor.get("scalars", {}))
        for name, entry in descriptor.get("tensors", {}).items():
            dtype = getattr(torch, str(entry["dtype"]), None)
            if not isinstance(dtype, torch.dtype):
                return Check(Status.INCORRECT_DTYPE, f"output `{name}` has an unknown dtype {entry['dtype']!r}")
            shape = [int(d) for d in entry["shape"]]
            want = expected.get(name)
            if isinstance(want, torch.Tensor) and (shape != list(want.shape) or dtype != want.dtype):
                return compare(name, torch.empty(shape, dtype=dtype, device="meta"), want, Tolerance())
            nbytes = int(entry["nbytes"])
            if nbytes != torch.empty(shape, dtype=dtype, device="meta").nbytes:
                return Check(Status.REWARD_HACK, f"output `{name}`'s shared bytes do not match its shape and dtype")
            raw = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            if nbytes:
                driver, runtime = bound()
                pointer, size = self._open(str(entry["handle"]), driver, runtime)
                offset = int(entry["offset"])
                if offset < 0 or (size is not None and offset + nbytes > size):
                    return Check(Status.REWARD_HACK, f"output `{name}` was shared outside its allocation")
                (error,) = runtime.cudaMemcpy(raw.data_ptr(), pointer + offset, nbytes,
                                              runtime.cudaMemcpyKind.cudaMemcpyDeviceToDevice)
                if error != runtime.cudaError_t.cudaSuccess:
                    raise RuntimeError(f"cudaMemcpy from the candidate's output `{name}`: {error}")
            values[name] = raw.view(dtype).reshape(shape)
        if self._opened:
            torch.cuda.synchronize(self.device)  # the copies are done before any handle is closed
        return values

    def _open(self, handle: str, driver, runtime) -> tuple[int, int | None]:
        if handle not in self._opened:
            ipc = runtime.cudaIpcMemHandle_t()
            ipc.reserved = bytes.fromhex(handle)
            error, pointer = runtime.cudaIpcOpenMemHandle(ipc, runtime.cudaIpcMemLazyEnablePeerAccess)
            if error != runtime.cudaError_t.cudaSuccess:
                raise RuntimeError(f"cudaIpcOpenMemHandle: {error}")
            error, _base, size = driver.cuMemGetAddressRange(int(pointer))
            self._opened[handle] = (int(pointer), int(size) if error == driver.CUresult.CUDA_SUCCESS else None)
        return self._opened[handle]

    def close(self) -> None:
        if not self._opened:
            return
        torch.cuda.synchronize(self.device)
        _driver, runtime = bound()
        for pointer, _size in self._opened.values():
            runtime.cudaIpcCloseMemHandle(pointer)
        self._opened.clear()

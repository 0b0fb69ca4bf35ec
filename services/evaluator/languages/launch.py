"""The `kernels` handle a `cuda` solution's Python entry receives: cubin functions launched with
pycuda, in torch's primary context, on torch's current stream.

    def run(x, w, out, *, kernels):
        n = out.numel()
        kernels.scale(x, w, out, n, grid=((n + 255) // 256,), block=(256,))

Tensors pass as device pointers, Python ints as 32-bit ints (`numpy` scalars for other widths),
floats as 32-bit floats. Every kernel the timed runs launch must be the cubin's own (CUPTI's
records, checked by `foreign_kernels`): PyTorch or a library computing in its place is REWARD_HACK.
`Kernels` is made only in the candidate child on a GPU machine: `import pycuda.driver` needs libcuda.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from services.evaluator.protocol import CandidateJob

# Kernels from elsewhere that a `cuda` solution may run: torch's fill of a buffer with a constant
# (`zero_`, `fill_`: workspace set up, not the operation's work). Any other kernel its cubin does not
# define is PyTorch or a library doing the work (`foreign_kernels`).
ALLOWED_LIBRARY_KERNELS = ("FillFunctor",)


def load(entry: Callable, job: CandidateJob) -> functools.partial:
    """The registry's loader for `cuda`: the entry gets `kernels=` (the cubin `nvcc.build` saved);
    torch's current stream becomes the launcher's."""
    device = torch.device(job.device)
    kernels = Kernels(Path(job.artifact_path).read_bytes(), device)
    torch.cuda.set_stream(torch.cuda.ExternalStream(kernels.stream().handle, device=device))
    return functools.partial(entry, kernels=kernels)


class Kernels:
    def __init__(self, cubin: bytes, device: torch.device) -> None:
        import pycuda.driver as driver

        driver.init()
        torch.cuda.init()
        self._driver = driver
        self._context = driver.Device(device.index or 0).retain_primary_context()
        self._context.push()  # the context torch already uses: pointers are shared
        self._module = driver.module_from_buffer(cubin)
        self._functions: dict[str, KernelFunction] = {}
        self._streams: dict[int, Any] = {}

    def stream(self) -> Any:
        """A pycuda stream for torch to use as its current one (torch.cuda.ExternalStream)."""
        stream = self._driver.Stream()
        self._streams[stream.handle] = stream
        return stream

    def pycuda_stream(self) -> Any:
        handle = torch.cuda.current_stream().cuda_stream
        if handle == 0:
            return None
        if handle not in self._streams:
            raise RuntimeError("kernels launch on torch's current stream, which must be the evaluator's "
                               "(do not switch streams inside run)")
        return self._streams[handle]

    def __getattr__(self, name: str) -> KernelFunction:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._functions:
            try:
                function = self._module.get_function(name)
            except self._driver.LogicError:
                raise AttributeError(f"the cubin has no kernel `{name}` (kernels must be extern \"C\" "
                                     f"__global__)") from None
            self._functions[name] = KernelFunction(self, function, name)
        return self._functions[name]

    def defines(self, name: str) -> bool:
        """Whether `name` (a kernel's name as CUPTI reports it) is a function of this cubin."""
        try:
            self._module.get_function(name)
        except (self._driver.LogicError, TypeError, ValueError):  # not found, or not a name it can look up
            return False
        return True

    def close(self) -> None:
        self._context.pop()


def foreign_kernels(seen: Iterable[str], defines: Callable[[str], bool]) -> str | None:
    """Why a `cuda` solution whose timed runs ran the GPU kernels `seen` (CUPTI's names, the timer's
    own left out) is a REWARD_HACK, or None: a kernel its cubin does not `defines` is PyTorch or a
    library computing in its place (fills of a buffer with a constant excepted)."""
    foreign = sorted(n for n in seen if not defines(n) and not any(a in n for a in ALLOWED_LIBRARY_KERNELS))
    if not foreign:
        return None
    shown = ", ".join(n[:120] for n in foreign[:4]) + (f" and {len(foreign) - 4} more" if len(foreign) > 4 else "")
    return (f"the `cuda` solution's timed runs ran GPU kernels that its cubin does not define: {shown} "
            f"(PyTorch or a library doing the work; a `cuda` solution's kernels must be its own)")


class KernelFunction:
    """Launches through pycuda's prepared calls: the argument layout is packed once per signature,
    which keeps the host's launch cost near the driver's (a plain pycuda call costs tens of µs)."""

    def __init__(self, owner: Kernels, function: Any, name: str) -> None:
        self._owner, self._function, self.name = owner, function, name
        self._signature: str | None = None
        self._shared_limit = 48 * 1024

    def __call__(self, *args: Any, grid: tuple[int, ...], block: tuple[int, ...], shared_mem: int = 0) -> None:
        values = [_argument(a) for a in args]
        signature = "".join(np.dtype(type(v)).char if not isinstance(v, np.uintp) else "P" for v in values)
        if signature != self._signature:
            self._function.prepare(signature)
            self._signature = signature
        if shared_mem > self._shared_limit:
            self._function.set_attribute(
                self._owner._driver.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_mem)
            self._shared_limit = shared_mem
        self._function.prepared_async_call(_dim3(grid)[:2] if _dim3(grid)[2] == 1 else _dim3(grid), _dim3(block),
                                           self._owner.pycuda_stream(), *values, shared_size=shared_mem)


def _argument(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if not value.is_cuda:
            raise TypeError("a tensor passed to a kernel must be on the GPU")
        return np.uintp(value.data_ptr())
    if isinstance(value, bool):
        return np.int32(value)
    if isinstance(value, int):
        return np.int32(value)
    if isinstance(value, float):
        return np.float32(value)
    return value


def _dim3(dims: tuple[int, ...] | int) -> tuple[int, int, int]:
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))

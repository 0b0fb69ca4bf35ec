"""Language `cute_dsl`: NVIDIA's CuTe DSL (the `nvidia-cutlass-dsl` package, `import cutlass.cute`).

The solution's entry is a `@cute.jit` function taking the call's tensors (inputs, then outputs: a
`cute_dsl` solution writes into its outputs) as `cute.Tensor`s, and scalars as they are. The child
compiles it with `cute.compile` once per signature (shapes, strides, dtypes, devices and the
scalars' types), on the first call with that signature: in a correctness round, never in a timed
run, and the compile time is reported apart (`compile` among the child's phases). Every call then
passes the tensors as DLPack views to the compiled function; that conversion is host work and is
timed with the call, as a solution written against torch would pay for its own launch.

A compile failure is `COMPILE_ERROR` with the DSL's message. Where the package is not installed the
attempt is `UNSUPPORTED` before any child starts (`unavailable`). Its registry entry's loader:
`preload` imports the DSL before the guards' snapshot, `load` wraps the entry.
"""

from __future__ import annotations

import importlib.util
import re
import time
from typing import Any

from services.evaluator.languages import CompiledEntry, CompileFailed
from services.evaluator.protocol import CandidateJob

MAX_MESSAGE_CHARS = 4000
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the DSL colours its diagnostics
INSTALL_HINT = ("language cute_dsl needs NVIDIA's CuTe DSL, which this evaluator does not have: "
                "install nvidia-cutlass-dsl (and cuda-python) in its environment")


def available() -> bool:
    """Whether `cutlass.cute` can be imported here (looked up, not imported: that takes a second)."""
    try:
        return importlib.util.find_spec("cutlass") is not None and importlib.util.find_spec("cutlass.cute") is not None
    except (ImportError, ValueError):
        return False


def unavailable() -> str | None:
    return None if available() else INSTALL_HINT


def preload() -> None:
    import cutlass.cute  # noqa: F401  (trusted, and before the guard's snapshot)


def load(entry: Any, job: CandidateJob) -> CuteEntry:
    return CuteEntry(entry)


class CuteEntry(CompiledEntry):
    """The entry of a `cute_dsl` solution, compiled per signature and called through DLPack."""

    def __init__(self, jit_function: Any) -> None:
        import cutlass.cute as cute
        from cutlass.cute.runtime import from_dlpack

        self.function, self.cute, self.from_dlpack = jit_function, cute, from_dlpack
        self.compiled: dict[tuple, Any] = {}
        self.compile_s = 0.0

    def __call__(self, *args: Any) -> Any:
        views = [self._view(a) for a in args]
        key = signature(args)
        compiled = self.compiled.get(key)
        if compiled is None:
            compiled = self.compiled[key] = self._compile(views)
        return compiled(*views)

    def _view(self, value: Any) -> Any:
        import torch

        return self.from_dlpack(value) if isinstance(value, torch.Tensor) else value

    def _compile(self, views: list[Any]) -> Any:
        began = time.perf_counter()
        try:
            return self.cute.compile(self.function, *views)
        except Exception as error:  # the DSL's own errors: a readable message is what an agent needs
            text = ANSI.sub("", f"{type(error).__name__}: {error}")
            raise CompileFailed(text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS] + " ...") from error
        finally:
            self.compile_s += time.perf_counter() - began


def signature(args: tuple[Any, ...]) -> tuple:
    """What a compiled function is specialised on: each tensor's shape, strides, dtype and device;
    each other argument's type."""
    import torch

    return tuple((tuple(a.shape), tuple(a.stride()), str(a.dtype), str(a.device)) if isinstance(a, torch.Tensor)
                 else type(a).__name__ for a in args)

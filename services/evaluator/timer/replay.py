"""The timer child's entry for a `cuda` solution: its launch plans replayed on the cubin, with the
call signature the harness gives every solution (`entry(*inputs, *outputs)`, or `entry(*inputs)`
returning the outputs). No Python of the solution's is imported: the plans are data the evaluator
validated (`plan.validate`), the kernels are the cubin's, launched through `launch.Kernels`
(pycuda's prepared calls) on the harness's stream.

Per workload (`select`), scratch is allocated once; per call, each buffer reference becomes the
pointer of that call's tensor plus its offset. Scratch that a call returns is allocated per call,
since the harness keeps every call's outputs until it checks them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from services.evaluator.timer.plan import BufferArg, Fill, Plan, Returned, ScalarArg


class ReplayEntry:
    """`launcher`: a `launch.Kernels` (or, in tests, any object whose attribute NAME launches kernel
    NAME with `grid=`, `block=`, `shared_mem=`)."""

    def __init__(self, plans: dict[str, Plan], input_names: list[str], output_names: list[str], launcher: Any,
                 device: torch.device, destination_passing: bool = True) -> None:
        self.plans, self.launcher, self.device = plans, launcher, device
        self.input_names, self.output_names, self.destination_passing = input_names, output_names, destination_passing
        self._bound: _Bound | None = None

    @classmethod
    def from_job(cls, job: Any, device: torch.device) -> ReplayEntry:
        """The harness's entry for a timer job (`protocol.CandidateJob`): `job.replay` maps workload
        UUIDs to plans, `job.artifact_path` is the cubin."""
        from pathlib import Path

        from services.evaluator.languages.launch import Kernels

        kernels = Kernels(Path(job.artifact_path).read_bytes(), device)
        torch.cuda.set_stream(torch.cuda.ExternalStream(kernels.stream().handle, device=device))
        plans = {uuid: Plan.model_validate(plan) for uuid, plan in job.replay.items()}
        return cls(plans, list(job.definition.inputs), list(job.definition.outputs), kernels, device,
                   job.destination_passing_style)

    @property
    def replay_kernels(self) -> Any:
        """The launcher, for `entry.cubin_kernels` (the foreign-kernel check asks it what it defines)."""
        return self.launcher

    def select(self, uuid: str) -> None:
        """The workload whose plan the next calls replay."""
        self._bound = _Bound(self.plans[uuid], self)

    def __call__(self, *args: Any) -> Any:
        if self._bound is None:
            raise RuntimeError("no workload selected")
        return self._bound(args)


class _Bound:
    """One plan made ready to replay: kernels looked up, scratch allocated, arguments pre-sorted."""

    def __init__(self, plan: Plan, entry: ReplayEntry) -> None:
        self.entry = entry
        per_call = {r.buffer.index for r in plan.returned or [] if r.buffer.kind == "scratch"}
        self.scratch_sizes = {s.index: s.size_bytes for s in plan.scratch}
        self.fresh = sorted(per_call)
        self.scratch = {i: torch.empty(n, dtype=torch.uint8, device=entry.device)
                        for i, n in self.scratch_sizes.items() if i not in per_call}
        self.steps: list[Callable[[dict], None]] = [self._step(step) for step in plan.steps]
        self.returned = plan.returned

    def __call__(self, args: tuple) -> Any:
        entry = self.entry
        count = len(entry.input_names)
        inputs = dict(zip(entry.input_names, args[:count]))
        tensors = {("input", n): v for n, v in inputs.items() if isinstance(v, torch.Tensor)}
        if entry.destination_passing:
            tensors.update((("output", n), t) for n, t in zip(entry.output_names, args[count:]))
        tensors.update((("scratch", i), t) for i, t in self.scratch.items())
        for i in self.fresh:
            tensors[("scratch", i)] = torch.empty(self.scratch_sizes[i], dtype=torch.uint8, device=entry.device)
        call = {"tensors": tensors, "inputs": inputs}
        for step in self.steps:
            step(call)
        if entry.destination_passing:
            return None
        return tuple(_returned(r, tensors) for r in self.returned or [])

    def _step(self, step) -> Callable[[dict], None]:
        if isinstance(step, Fill):
            ref, size, dtype, value = step.buffer, step.size_bytes, getattr(torch, step.dtype), step.value
            return lambda call: _region(call["tensors"][ref.key()], ref.offset_bytes, size, dtype).fill_(value)
        launcher = self.entry.launcher  # by its lookup of kernels: a kernel named `close` is no method of it
        function = type(launcher).__getattr__(launcher, step.kernel)
        grid, block, shared = step.grid, step.block, step.shared_mem_bytes
        binders = [_binder(arg) for arg in step.args]
        return lambda call: function(*(b(call) for b in binders), grid=grid, block=block, shared_mem=shared)


def _binder(arg: BufferArg | ScalarArg) -> Callable[[dict], Any]:
    """What an argument is in a call: a pointer into that call's buffer, or a scalar of its width."""
    if isinstance(arg, BufferArg):
        key, offset = arg.key(), arg.offset_bytes
        return lambda call: np.uintp(call["tensors"][key].data_ptr() + offset)
    kind = np.dtype(arg.dtype).type
    if arg.input is not None:
        name = arg.input
        return lambda call: kind(call["inputs"][name])
    value = kind(arg.value)
    return lambda call: value


def _region(base: torch.Tensor, offset_bytes: int, size_bytes: int, dtype: torch.dtype) -> torch.Tensor:
    """`size_bytes` of `base`'s memory from `offset_bytes` on, as a flat tensor of `dtype`."""
    start = base.storage_offset() * base.element_size() + offset_bytes
    flat = torch.empty(0, dtype=torch.uint8, device=base.device)
    flat.set_(base.untyped_storage(), start, (size_bytes,), (1,))
    return flat.view(dtype)


def _returned(returned: Returned, tensors: dict) -> torch.Tensor:
    base = tensors[returned.buffer.key()]
    dtype = getattr(torch, returned.dtype)
    start = base.storage_offset() * base.element_size() + returned.buffer.offset_bytes
    out = torch.empty(0, dtype=dtype, device=base.device)
    out.set_(base.untyped_storage(), start // out.element_size(), returned.shape, returned.stride)
    return out

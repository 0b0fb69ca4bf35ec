"""What the candidate's harness needs of a solution and of a definition's outputs: the solution's
entry loaded for its language, output buffers pre-filled so that an unwritten element fails, and
what an entry returned named as the definition's outputs. Part of the harness the guards watch
(`guards.HARNESS`): nothing here may be rebound while a solution runs.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from services.evaluator.languages import entry_for
from services.evaluator.protocol import CandidateJob
from services.evaluator.harness.inputs import torch_dtype
from shared.schema import Definition


def empty_outputs(definition: Definition, axes: dict[str, int], device: torch.device) -> dict[str, torch.Tensor]:
    """Outputs pre-filled so that an element the kernel never writes fails the check."""
    buffers = {}
    for name, spec in definition.outputs.items():
        shape = definition.shape_of(spec, axes)
        if shape is None:
            raise ValueError(f"output `{name}` is a scalar: use destination_passing_style=false")
        dtype = torch_dtype(spec.dtype)
        if dtype.is_floating_point and dtype.itemsize >= 2:
            buffers[name] = torch.full(shape, float("nan"), dtype=dtype, device=device)
        elif dtype == torch.bool:
            buffers[name] = torch.zeros(shape, dtype=dtype, device=device)
        elif dtype.is_floating_point or dtype.itemsize == 1:
            buffers[name] = torch.full(shape, 0x7F, dtype=torch.uint8, device=device).view(dtype)
        else:
            buffers[name] = torch.full(shape, torch.iinfo(dtype).min, dtype=dtype, device=device)
    return buffers


def empty_holding(definition: Definition, axes: dict[str, int], device: torch.device) -> dict[str, torch.Tensor]:
    """`empty_outputs` for the tensor outputs only (a scalar output has no buffer): where a timed
    run's returned outputs are copied (`hold`)."""
    tensors = {n: spec for n, spec in definition.outputs.items() if definition.shape_of(spec, axes) is not None}
    if len(tensors) == len(definition.outputs):
        return empty_outputs(definition, axes, device)
    return empty_outputs(definition.model_copy(update={"outputs": tensors}), axes, device)


def hold(returned: dict[str, Any], holding: dict[str, torch.Tensor]) -> dict[str, Any]:
    """A timed run's returned outputs copied into `holding` (allocated before the run), each that is
    a plain tensor of its buffer's shape, dtype and device; the others as returned. Untimed, once the
    run is over: its own memory is then free for the next run, as an output that nothing keeps is
    (the candidate's and the reference's timed runs both go through this)."""
    held: dict[str, Any] = {}
    for name, value in returned.items():
        into = holding.get(name)
        if type(value) is torch.Tensor and into is not None and value.shape == into.shape \
                and value.dtype == into.dtype and value.device == into.device:
            into.copy_(value)
            held[name] = into
        else:
            held[name] = value
    return held


def off_definition(definition: Definition, axes: dict[str, int], outputs: dict[str, Any]) -> str | None:
    """How the reference's `outputs` differ from the definition's outputs on these axes (shape and
    dtype of each tensor output), or None. Such a reference makes every solution fail, whatever it
    computes: the candidate's buffers and checks follow the definition. Scalar outputs are left as
    they are."""
    for name, spec in definition.outputs.items():
        shape, value = definition.shape_of(spec, axes), outputs.get(name)
        if shape is None:
            continue
        if not isinstance(value, torch.Tensor):
            return f"output `{name}` is a {type(value).__name__}, the definition has a {spec.dtype.value} tensor {shape}"
        if tuple(value.shape) != shape:
            return f"output `{name}` has shape {tuple(value.shape)}, the definition says {shape}"
        if value.dtype != torch_dtype(spec.dtype):
            return (f"output `{name}` has dtype {str(value.dtype).removeprefix('torch.')}, the definition says "
                    f"{spec.dtype.value}")
    return None


def as_outputs(definition: Definition, returned: Any) -> dict[str, Any]:
    names = list(definition.outputs)
    if isinstance(returned, dict):
        return {n: returned.get(n) for n in names}
    if not isinstance(returned, (tuple, list)):
        returned = (returned,)
    if len(returned) != len(names):
        raise ValueError(f"returned {len(returned)} outputs, the definition has {len(names)} ({names})")
    return dict(zip(names, returned))


def load_entry(job: CandidateJob):
    """The solution's entry for its language (`languages.REGISTRY`): its Python entry where it has
    one, as the language's loader makes it; a timer job's replayed launch plans (language `cuda`,
    `timer/replay.py`), with no Python of the solution's."""
    if job.replay is not None:
        from services.evaluator.timer.replay import ReplayEntry

        return ReplayEntry.from_job(job, torch.device(job.device))
    language = entry_for(job.language)
    entry = None
    if language.python_entry:
        source_dir = Path(job.solution_dir)
        path = source_dir / job.entry_file
        sys.path.insert(0, str(source_dir))
        module = load_module("solution_entry", path.read_text(), job.tunables, str(path))
        entry = getattr(module, job.entry_symbol, None)
        if not callable(entry):
            raise AttributeError(f"{job.entry_file} defines no callable `{job.entry_symbol}`")
    return language.load(entry, job)


def cubin_kernels(entry) -> Any:
    """The `kernels` handle (`launch.Kernels`) of a `cuda` solution's entry, in process or replayed
    (`timer.replay.ReplayEntry`); None for other languages."""
    if isinstance(entry, functools.partial):
        return entry.keywords.get("kernels")
    return getattr(entry, "replay_kernels", None)


def load_module(name: str, source: str, constants: dict[str, Any], filename: str) -> ModuleType:
    """Execute `source` as a module whose globals start with the tunable `constants`."""
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update(constants)
    module.__file__ = filename
    sys.modules[name] = module
    exec(compile(source, filename, "exec"), module.__dict__)  # noqa: S102 - running it is the point
    return module

"""Build a solution into a folder the child can load: Python languages are written out and checked
for syntax; `cuda` sources go through nvcc into one cubin (`nvcc.py`), `cuda_cpp` sources into a torch
extension module (`torchext.py`), both cached by build key."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.evaluator.languages import cutedsl
from services.evaluator.languages.nvcc import BuildCache, build_cubin
from services.evaluator.languages.torchext import build_extension, module_name
from shared.schema import Language, Solution, Status
from shared.schema.solution import LANGUAGES_BY_DEVICE

CUBIN_FILE = "kernels.cubin"
SUPPORTED = LANGUAGES_BY_DEVICE


@dataclass(frozen=True)
class Build:
    status: Status | None  # None: built
    log: str
    solution_dir: Path
    tunables: dict[str, object]
    cubin_path: Path | None = None
    build_s: float = 0.0
    cached: bool = False
    extension_path: Path | None = None  # cuda_cpp: the extension module (file name = module name)


def build_solution(solution: Solution, device: str, target: Path, arch: str | None = None,
                   cache: BuildCache | None = None) -> Build:
    language = solution.spec.language
    tunables = resolved_tunables(solution)
    supported = SUPPORTED.get(device.split(":")[0], set())
    if language not in supported:
        names = ", ".join(sorted(s.value for s in supported)) or "none"
        return Build(Status.UNSUPPORTED, f"language {language.value} does not run on device {device} "
                                         f"(this evaluator runs: {names})", target, tunables)
    if language is Language.CUTE_DSL and not cutedsl.available():
        return Build(Status.UNSUPPORTED, cutedsl.INSTALL_HINT, target, tunables)
    target.mkdir(parents=True, exist_ok=True)
    errors = []
    for source in solution.sources:
        path = target / source.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source.content)
        if path.suffix == ".py":
            try:
                compile(source.content, source.path, "exec")
            except SyntaxError as error:
                errors.append(f"{source.path}:{error.lineno}:{error.offset}: {error.msg}\n    {error.text or ''}")
    if errors:
        return Build(Status.COMPILE_ERROR, "\n".join(errors), target, tunables)
    if language is Language.CUDA_CPP:
        built = build_extension(solution, arch or "sm_90a", tunables, target.parent / "torchext", cache)
        if not built.ok:
            return Build(Status.COMPILE_ERROR, built.log, target, tunables, build_s=built.seconds)
        library = target / f"{module_name(built.key)}.so"
        library.write_bytes(built.cubin)
        return Build(None, "", target, tunables, build_s=built.seconds, cached=built.cached, extension_path=library)
    if language is not Language.CUDA:
        return Build(None, "", target, tunables)
    cubin = build_cubin(solution, arch or "sm_90a", tunables, target.parent / "nvcc", cache)
    if not cubin.ok:
        return Build(Status.COMPILE_ERROR, cubin.log, target, tunables, build_s=cubin.seconds)
    (target / CUBIN_FILE).write_bytes(cubin.cubin)
    return Build(None, "", target, tunables, target / CUBIN_FILE, cubin.seconds, cubin.cached)


def resolved_tunables(solution: Solution) -> dict[str, object]:
    """Every declared tunable gets a value: the chosen one, else the first listed."""
    spec = solution.spec
    return {name: spec.tunable_values.get(name, values[0]) for name, values in spec.tunables.items()}

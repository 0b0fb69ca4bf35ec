"""Build a solution into a folder the child can load: every source written out and the Python ones
checked for syntax, then the language's own build step where its registry entry has one (`cuda`:
nvcc's cubin, `nvcc.py`; `cuda_cpp`: a torch extension module, `torchext.py`; both cached by build
key). A language the device cannot run, or this machine lacks, is UNSUPPORTED before anything runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.evaluator.languages import entry_for, languages_on
from services.evaluator.languages.nvcc import BuildCache
from shared.schema import Solution, Status


@dataclass(frozen=True)
class Build:
    status: Status | None  # None: built
    log: str
    solution_dir: Path
    tunables: dict[str, object]
    artifact_path: Path | None = None  # what the language's build step made (a cubin, an extension module)
    build_s: float = 0.0
    cached: bool = False


def build_solution(solution: Solution, device: str, target: Path, arch: str | None = None,
                   cache: BuildCache | None = None) -> Build:
    language = solution.spec.language
    tunables = resolved_tunables(solution)
    entry = entry_for(language)
    if entry is None or not entry.runs_on(device):
        names = ", ".join(sorted(s.value for s in languages_on(device))) or "none"
        return Build(Status.UNSUPPORTED, f"language {language.value} does not run on device {device} "
                                         f"(this evaluator runs: {names})", target, tunables)
    why = entry.unavailable()
    if why:
        return Build(Status.UNSUPPORTED, why, target, tunables)
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
    built = entry.build(solution, target, tunables, arch or "sm_90a", cache)
    if built is None:
        return Build(None, "", target, tunables)
    if not built.ok:
        return Build(Status.COMPILE_ERROR, built.log, target, tunables, build_s=built.seconds)
    return Build(None, "", target, tunables, built.artifact, built.seconds, built.cached)


def resolved_tunables(solution: Solution) -> dict[str, object]:
    """Every declared tunable gets a value: the chosen one, else the first listed."""
    spec = solution.spec
    return {name: spec.tunable_values.get(name, values[0]) for name, values in spec.tunables.items()}

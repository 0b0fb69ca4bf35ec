"""Build a solution into a folder the child can load. CPU skeleton: Python languages only;
`cuda` (nvcc -> cubin) and `cpp` come with the GPU evaluator."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shared.schema import Language, Solution, Status

PYTHON_LANGUAGES = {Language.PYTORCH, Language.TRITON}
SUPPORTED = {
    "cpu": {Language.PYTORCH},
    "cuda": {Language.PYTORCH, Language.TRITON},
}


@dataclass(frozen=True)
class Build:
    status: Status | None  # None: built
    log: str
    solution_dir: Path
    tunables: dict[str, object]


def build_solution(solution: Solution, device: str, target: Path) -> Build:
    language = solution.spec.language
    tunables = resolved_tunables(solution)
    supported = SUPPORTED.get(device.split(":")[0], set())
    if language not in supported:
        names = ", ".join(sorted(s.value for s in supported)) or "none"
        return Build(Status.UNSUPPORTED, f"language {language.value} does not run on device {device} "
                                         f"(this evaluator runs: {names})", target, tunables)
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
    return Build(None, "", target, tunables)


def resolved_tunables(solution: Solution) -> dict[str, object]:
    """Every declared tunable gets a value: the chosen one, else the first listed."""
    spec = solution.spec
    return {name: spec.tunable_values.get(name, values[0]) for name, values in spec.tunables.items()}

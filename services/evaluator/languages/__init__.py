"""The languages the evaluator runs: one registry entry each (`REGISTRY`), and everything that
lists languages derives from it (the device's languages, `runs_on`, the build's UNSUPPORTED check,
the worker's tool schema and default entry points).

An entry names its language, the device kinds that can run it (availability; a language module's
`unavailable()` may still refuse it on a machine, e.g. a missing package), and the modules of this
package that build it and load its entry:

- `builder`: a module with `build(solution, target, tunables, arch, cache) -> Built`, run on the
  evaluator's side after the sources were written to `target` (nvcc's cubin, torch's extension);
  none: the sources are all there is (Python languages).
- `loader`: a module with `load(entry, job) -> callable`, run in the candidate's child: what the
  solution's Python entry (`python_entry`; else None) becomes, given the job (its `artifact_path`
  holds what `build` made); optionally `preload()`, run before the guards take their snapshot
  (trusted imports). None: the Python entry as it is.

Adding a language: its module(s) here, its entry in `REGISTRY`, its section in
services/worker/PROTOCOL.md. This module imports no language module until asked (the worker and the
fork server import it; nothing heavy may load with it).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from shared.schema import Language, Solution


@dataclass(frozen=True)
class Built:
    """What a language's own build step made: `artifact` (a file in the solution's folder that its
    loader reads, e.g. the cubin) or, where `ok` is false, the compiler's `log`."""
    ok: bool
    log: str = ""
    artifact: Path | None = None
    seconds: float = 0.0
    cached: bool = False


class CompileFailed(Exception):
    """A language compiled the solution in the child (on its first call) and the compiler refused it:
    the workload's status is COMPILE_ERROR with this message."""


class CompiledEntry:
    """An entry that compiles in the child; `compile_s` is reported among the child's phases."""
    compile_s: float = 0.0


@dataclass(frozen=True)
class LanguageEntry:
    language: Language
    devices: frozenset[str]  # device kinds ("cpu", "cuda") whose evaluators run it
    for_writers: bool = True  # offered to the LLM writers (the worker's tool schema)
    default_entry: str = "main.py::run"  # a writer's entry point where it names none
    python_entry: bool = True  # the entry point names a Python function (else the loader finds it)
    builder: str | None = None
    loader: str | None = None

    @property
    def name(self) -> str:
        return self.language.value

    def runs_on(self, device: str) -> bool:
        return device.split(":")[0] in self.devices

    def unavailable(self) -> str | None:
        """Why this machine cannot run it although its device kind could (None: it can)."""
        for module in {self._module(self.builder), self._module(self.loader)} - {None}:
            check = getattr(module, "unavailable", None)
            why = check() if check is not None else None
            if why:
                return why
        return None

    def build(self, solution: Solution, target: Path, tunables: dict[str, object], arch: str,
              cache: Any = None) -> Built | None:
        """The language's own build step (None: it has none)."""
        module = self._module(self.builder)
        return module.build(solution, target, tunables, arch, cache) if module is not None else None

    def preload(self) -> None:
        preload = getattr(self._module(self.loader), "preload", None)
        if preload is not None:
            preload()

    def load(self, entry: Any, job: Any) -> Any:
        """In the candidate's child: the entry as the language calls it (`job`: its `CandidateJob`)."""
        module = self._module(self.loader)
        return module.load(entry, job) if module is not None else entry

    @staticmethod
    def _module(name: str | None) -> ModuleType | None:
        return importlib.import_module(f"{__name__}.{name}") if name else None


REGISTRY: dict[Language, LanguageEntry] = {entry.language: entry for entry in (
    LanguageEntry(Language.CUDA, frozenset({"cuda"}), default_entry="launch.py::run", builder="nvcc",
                  loader="launch"),
    LanguageEntry(Language.PYTORCH, frozenset({"cpu", "cuda"})),
    LanguageEntry(Language.TRITON, frozenset({"cuda"})),
    LanguageEntry(Language.CUTE_DSL, frozenset({"cuda"}), loader="cutedsl"),
    # SOL-ExecBench's torch extension: runs their solutions unchanged; writers are steered to `cuda`.
    LanguageEntry(Language.CUDA_CPP, frozenset({"cuda"}), for_writers=False, default_entry="kernel.cu::run",
                  python_entry=False, builder="torchext", loader="torchext"),
)}


def entry_for(language: Language | str) -> LanguageEntry | None:
    try:
        return REGISTRY.get(Language(language))
    except ValueError:  # not a language of the schema at all
        return None


def languages_on(device: str) -> frozenset[Language]:
    """The languages an evaluator on `device` ("cpu", "cuda:0") runs; the others are UNSUPPORTED there."""
    return frozenset(language for language, entry in REGISTRY.items() if entry.runs_on(device))


def runs_on(solution: Solution, device: str) -> bool:
    return solution.spec.language in languages_on(device)


def writer_languages() -> list[str]:
    """The languages the worker's tool schema offers, in the registry's order."""
    return [entry.name for entry in REGISTRY.values() if entry.for_writers]


def default_entry(language: str) -> str:
    entry = entry_for(language)
    return entry.default_entry if entry is not None else "main.py::run"

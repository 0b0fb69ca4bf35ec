"""The language registry (`services/evaluator/languages/__init__.py`): every list of languages is
derived from it, and each entry's modules have what the registry calls."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from services.evaluator import languages
from services.evaluator.languages import REGISTRY, LanguageEntry, languages_on, runs_on, writer_languages
from services.evaluator.languages.build import build_solution
from services.worker.agent import solution_from_arguments
from services.worker.llm import tool_schemas
from shared.schema import Language, Solution, Status


def solution(language: str, entry_point: str = "main.py::run") -> Solution:
    return Solution.model_validate({
        "name": "s", "definition": "d", "author": "tests",
        "spec": {"languages": [language], "target_hardware": ["LOCAL"], "entry_point": entry_point},
        "sources": [{"path": "main.py", "content": "def run(x, y):\n    y.copy_(x)\n"}]})


def test_each_device_kind_runs_the_languages_its_entries_name():
    assert languages_on("cpu") == {Language.PYTORCH}
    assert languages_on("cuda:1") == {Language.PYTORCH, Language.TRITON, Language.CUDA, Language.CUTE_DSL,
                                      Language.CUDA_CPP}
    assert runs_on(solution("pytorch"), "cpu") and not runs_on(solution("triton"), "cpu")
    assert not runs_on(solution("tlx"), "cuda")  # in the schema, in no registry entry


def test_the_workers_schema_and_default_entries_come_from_the_registry():
    for schema in tool_schemas(("evaluate", "profile", "inspect")):  # every tool that takes a solution
        assert schema["function"]["parameters"]["properties"]["language"]["enum"] == writer_languages()
    assert "cuda_cpp" not in writer_languages() and "cuda" in writer_languages()
    made = solution_from_arguments_for("cuda")
    assert made.spec.entry_point == "launch.py::run"
    assert solution_from_arguments_for("pytorch").spec.entry_point == "main.py::run"


def solution_from_arguments_for(language: str) -> Solution:
    from types import SimpleNamespace

    problem = SimpleNamespace(name="p")
    files = [{"path": "launch.py", "content": "x = 1\n"}, {"path": "main.py", "content": "x = 1\n"}]
    return solution_from_arguments(problem, "tests", 0, {"language": language, "files": files})


@pytest.mark.parametrize("entry", list(REGISTRY.values()), ids=lambda e: e.name)
def test_every_entrys_modules_have_what_the_registry_calls(entry: LanguageEntry):
    if entry.builder:
        assert callable(importlib.import_module(f"services.evaluator.languages.{entry.builder}").build)
    if entry.loader:
        assert callable(importlib.import_module(f"services.evaluator.languages.{entry.loader}").load)
    assert entry.python_entry or entry.loader  # an entry from somewhere


def test_a_language_added_to_the_registry_alone_is_built_and_run(tmp_path, monkeypatch):
    """What adding a language takes on the evaluator's side: an entry (here `tlx`, with pytorch's
    handling). Before it, the build says UNSUPPORTED; with it, the build passes and the device's
    languages and the writers' list name it."""
    assert build_solution(solution("tlx"), "cpu", tmp_path / "before").status is Status.UNSUPPORTED
    added = dict(REGISTRY)
    added[Language.TLX] = dataclasses.replace(REGISTRY[Language.PYTORCH], language=Language.TLX)
    monkeypatch.setattr(languages, "REGISTRY", added)
    assert Language.TLX in languages_on("cpu") and "tlx" in writer_languages()
    built = build_solution(solution("tlx"), "cpu", tmp_path / "after")
    assert built.status is None and (built.solution_dir / "main.py").exists()


def test_a_machine_without_a_languages_package_says_so(tmp_path, monkeypatch):
    from services.evaluator.languages import cutedsl

    monkeypatch.setattr(cutedsl, "available", lambda: False)
    assert REGISTRY[Language.CUTE_DSL].unavailable() == cutedsl.INSTALL_HINT
    monkeypatch.setattr(cutedsl, "available", lambda: True)
    assert REGISTRY[Language.CUTE_DSL].unavailable() is None

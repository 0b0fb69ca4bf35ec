"""Schema fuzzing: arbitrary JSON values and mutations of valid documents go through the schema
loaders (`parse_model`) and through `load_problem` on a folder. Each either loads or raises a
FormatError whose every line names the source and a JSON path (or the file's line); nothing else
escapes. A problem that loads survives the round trip the DB makes (`model_dump_json`, then
parsed again) and resolves to non-negative axis sizes."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import pytest
from fuzzcases import (
    DEFINITION,
    FUZZ,
    SOLUTION,
    TRACE,
    WORKLOAD,
    count,
    damaged_text,
    dumps,
    expressions,
    json_values,
    jsonl,
    library_documents,
    mutated,
)
from hypothesis import event, given, settings
from hypothesis import strategies as st

from shared.errors import FormatError
from shared.schema import Definition, Solution, Trace, Workload, load_problem, parse_model

MODELS = {"definition": (Definition, DEFINITION), "workload": (Workload, WORKLOAD),
          "solution": (Solution, SOLUTION), "trace": (Trace, TRACE)}
LIBRARY = library_documents()


def assert_names_a_path(message: str, source: str) -> None:
    lines = message.split("\n")
    assert lines and all(line.startswith(f"{source}: $") for line in lines), message


def check_parse(name: str, data) -> None:
    model, _ = MODELS[name]
    try:
        loaded = parse_model(model, data, f"fuzz {name}")
    except FormatError as error:
        event("refused")
        assert_names_a_path(str(error), f"fuzz {name}")
        return
    event("loaded")
    assert isinstance(loaded, model)


@pytest.mark.parametrize("name", sorted(MODELS))
@settings(max_examples=400, **FUZZ)
@given(data=json_values)
def test_any_json_value(name, data):
    count(f"schema.{name}.any_value")
    check_parse(name, data)


@pytest.mark.parametrize("name", sorted(MODELS))
@settings(max_examples=800, **FUZZ)
@given(data=st.data())
def test_mutated_document(name, data):
    count(f"schema.{name}.mutated")
    check_parse(name, data.draw(mutated(MODELS[name][1])))


# --- load_problem on a folder ------------------------------------------------------------------------------

FILE_LINE = re.compile(r"(definition\.json|workload\.jsonl)(:\d+)*: "
                       r"(\$|invalid JSON|not UTF-8|no workloads|duplicate workload uuids|file not found)")


def check_folder(definition_text: str, workloads_text: str | bytes) -> None:
    with tempfile.TemporaryDirectory(prefix="ks-fuzz-") as folder:
        root = Path(folder)
        (root / "definition.json").write_text(definition_text, encoding="utf-8", errors="surrogatepass")
        if isinstance(workloads_text, bytes):
            (root / "workload.jsonl").write_bytes(workloads_text)
        else:
            (root / "workload.jsonl").write_text(workloads_text, encoding="utf-8", errors="surrogatepass")
        try:
            problem = load_problem(root, with_seeds=False)
        except FormatError as error:
            event("refused")
            for line in str(error).split("\n"):
                assert line.startswith(f"{root}/") and FILE_LINE.match(line[len(root.as_posix()) + 1:]), str(error)
            return
    event("loaded")
    definition = problem.definition
    assert parse_model(Definition, json.loads(definition.model_dump_json(exclude_unset=True)), "db") == definition
    for workload in problem.workloads:
        assert parse_model(Workload, json.loads(workload.model_dump_json(exclude_unset=True)), "db") == workload
        sizes = definition.resolve_axes(workload.axes)
        assert all(isinstance(v, int) and v >= 0 for v in sizes.values()), sizes


@settings(max_examples=1500, **FUZZ)
@given(data=st.data())
def test_problem_folder(data):
    count("schema.load_problem.mutated")
    definition, workloads = data.draw(st.sampled_from([(DEFINITION, [WORKLOAD]), *LIBRARY]))
    if data.draw(st.booleans()):
        definition = data.draw(mutated(definition))
    else:
        workloads = data.draw(st.lists(st.sampled_from(workloads).flatmap(mutated), min_size=0, max_size=3))
    definition_text = data.draw(damaged_text(dumps(definition)))
    workloads_text = data.draw(damaged_text(jsonl(workloads)))
    if data.draw(st.integers(0, 20)) == 0:
        workloads_text = workloads_text.encode("utf-8", "surrogatepass")[:-3] + b"\xff\xfe"
    check_folder(definition_text, workloads_text)


@settings(max_examples=1500, **FUZZ)
@given(expression=expressions, where=st.sampled_from(["axis", "sol", "constraint"]), n=st.sampled_from(
    [0, 1, 7, 2**40, 10**100]))
def test_axis_expressions(expression, where, n):
    """Expressions are where user text is evaluated: every one is an axis size, or refused."""
    count(f"schema.expression.{where}")
    definition = json.loads(json.dumps(DEFINITION))
    if where == "axis":
        definition["axes"]["m"]["expression"] = expression
    elif where == "sol":
        definition["sol"]["flops"] = expression
    else:
        definition["constraints"] = [expression]
    check_folder(dumps(definition), jsonl([{**WORKLOAD, "axes": {"n": n}}]))

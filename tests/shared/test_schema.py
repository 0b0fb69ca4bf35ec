"""shared.schema: the published SOL-ExecBench problems load unchanged; bad files are FormatErrors
that name the file and the JSON path."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from shared.errors import FormatError
from shared.schema import (
    AxisExpr,
    Definition,
    Solution,
    Tolerance,
    Workload,
    load_problem,
    load_solution,
    parse_model,
)

SAMPLE = Path(__file__).resolve().parents[2].parent / "shared" / "sol-execbench-sample"
SAMPLE_PROBLEMS = sorted(p for p in SAMPLE.glob("*/*") if p.is_dir())
SAMPLE_SIZE = 30

needs_sample = pytest.mark.skipif(not SAMPLE.is_dir(), reason=f"SOL-ExecBench sample not found at {SAMPLE}")

DEFINITION: dict[str, Any] = {
    "name": "scale_flatten",
    "axes": {
        "n": {"type": "var"},
        "m": {"type": "const", "value": 4},
        "nm": {"type": "expr", "expression": "n * m"},
    },
    "inputs": {
        "x": {"shape": ["n", "m"], "dtype": "float32"},
        "alpha": {"shape": None, "dtype": "float32"},
    },
    "outputs": {"y": {"shape": ["nm"], "dtype": "float32"}},
    "reference": "import torch\n\ndef run(x, alpha):\n    return (x * alpha).flatten()\n",
}

WORKLOAD: dict[str, Any] = {
    "uuid": "w-1",
    "axes": {"n": 3},
    "inputs": {"x": {"type": "random"}, "alpha": {"type": "scalar", "value": 0.5}},
    "tolerance": {"max_atol": 1e-3, "max_rtol": 1e-3, "required_match_ratio": 0.99},
}

SOLUTION: dict[str, Any] = {
    "name": "scale_flatten_torch",
    "definition": "scale_flatten",
    "author": "tests",
    "spec": {"languages": ["pytorch"], "target_hardware": ["LOCAL"], "entry_point": "main.py::run"},
    "sources": [{"path": "main.py", "content": "def run(x, alpha, y):\n    y.copy_((x * alpha).flatten())\n"}],
}


def write_problem(root: Path, definition: dict[str, Any], workloads: list[dict[str, Any]]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "definition.json").write_text(json.dumps(definition, indent=2))
    (root / "workload.jsonl").write_text("".join(json.dumps(w) + "\n" for w in workloads))
    return root


def format_error(path: Path, definition: dict[str, Any], workloads: list[dict[str, Any]]) -> str:
    """The message of the FormatError that loading this problem raises."""
    with pytest.raises(FormatError) as raised:
        load_problem(write_problem(path, definition, workloads))
    return str(raised.value)


def edited(data: dict[str, Any], *keys: str | int, value: Any) -> dict[str, Any]:
    """A deep copy of `data` with `data[k0][k1]...[kn] = value`."""
    copy_ = copy.deepcopy(data)
    node = copy_
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    return copy_


# The published sample.


@needs_sample
def test_sample_has_all_problems():
    assert len(SAMPLE_PROBLEMS) == SAMPLE_SIZE


@needs_sample
@pytest.mark.parametrize("folder", SAMPLE_PROBLEMS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_sample_problem_loads(folder: Path):
    problem = load_problem(folder)

    assert problem.name == json.loads((folder / "definition.json").read_text())["name"]
    lines = [line for line in (folder / "workload.jsonl").read_text().splitlines() if line.strip()]
    assert len(problem.workloads) == len(lines)
    for workload in problem.workloads:
        problem.definition.resolve_axes(workload.axes)


@needs_sample
@pytest.mark.parametrize("folder", SAMPLE_PROBLEMS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_sample_definition_round_trips(folder: Path):
    definition = load_problem(folder, with_seeds=False).definition

    again = Definition.model_validate(json.loads(definition.model_dump_json(exclude_unset=True)))

    assert again == definition


@needs_sample
def test_sample_reads_both_spellings_of_matched_ratio():
    """The published data writes `required_match_ratio` in some problems; it must not fall back to
    the default of 1.0."""
    seen = {}
    for folder in SAMPLE_PROBLEMS:
        problem = load_problem(folder, with_seeds=False)
        for line, workload in zip((folder / "workload.jsonl").read_text().splitlines(), problem.workloads):
            tolerance = json.loads(line).get("tolerance") or {}
            for spelling in ("required_match_ratio", "required_matched_ratio"):
                if spelling in tolerance:
                    assert workload.effective_tolerance.required_matched_ratio == tolerance[spelling]
                    seen[spelling] = True
    assert seen == {"required_match_ratio": True, "required_matched_ratio": True}


# Inline fixtures: what loads.


def test_inline_problem_loads(tmp_path: Path):
    problem = load_problem(write_problem(tmp_path / "p", DEFINITION, [WORKLOAD]))

    assert problem.name == "scale_flatten"
    (workload,) = problem.workloads
    assert workload.effective_tolerance.max_atol == 1e-3
    assert problem.definition.resolve_axes(workload.axes) == {"n": 3, "m": 4, "nm": 12}


def test_workload_round_trips_under_the_written_spelling():
    workload = parse_model(Workload, WORKLOAD, "workload.jsonl:1")

    dumped = json.loads(workload.model_dump_json(exclude_unset=True))

    assert dumped["tolerance"]["required_matched_ratio"] == 0.99
    assert "required_match_ratio" not in dumped["tolerance"]
    assert Workload.model_validate(dumped) == workload


@pytest.mark.parametrize("spelling", ["required_match_ratio", "required_matched_ratio"])
def test_tolerance_reads_either_spelling(spelling: str):
    assert Tolerance.model_validate({spelling: 0.9}).required_matched_ratio == 0.9


def test_tolerance_rejects_both_spellings_at_once():
    with pytest.raises(FormatError, match=r"t\.json: \$\.required_match_ratio: Extra inputs"):
        parse_model(Tolerance, {"required_matched_ratio": 0.9, "required_match_ratio": 0.5}, "t.json")


# Unknown or misspelt fields: the message names the file and the JSON path.


@pytest.mark.parametrize(
    ("keys", "path"),
    [
        (("axes", "n", "typo"), "$.axes.n.typo"),
        (("axes", "m", "valu"), "$.axes.m.valu"),
        (("axes", "nm", "expresion"), "$.axes.nm.expresion"),
        (("inputs", "x", "dtyp"), "$.inputs.x.dtyp"),
        (("outputs", "y", "shap"), "$.outputs.y.shap"),
        (("refrence",), "$.refrence"),
    ],
)
def test_unknown_definition_field_names_the_path(tmp_path: Path, keys: tuple[str, ...], path: str):
    message = format_error(tmp_path / "p", edited(DEFINITION, *keys, value=1), [WORKLOAD])

    assert f"definition.json: {path}: Extra inputs are not permitted" in message


def test_unknown_axis_type_names_the_axis(tmp_path: Path):
    message = format_error(tmp_path / "p", edited(DEFINITION, "axes", "n", "type", value="vra"), [WORKLOAD])

    assert "definition.json: $.axes.n: " in message
    assert "'vra'" in message


def test_bad_dtype_names_the_tensor(tmp_path: Path):
    message = format_error(tmp_path / "p", edited(DEFINITION, "inputs", "x", "dtype", value="float31"), [WORKLOAD])

    assert "definition.json: $.inputs.x.dtype: " in message


@pytest.mark.parametrize(
    ("keys", "path"),
    [
        (("inputs", "x", "seed"), "$.inputs.x.seed"),
        (("inputs", "alpha", "valeu"), "$.inputs.alpha.valeu"),
        (("tolerance", "max_atl"), "$.tolerance.max_atl"),
        (("tolerence",), "$.tolerence"),
    ],
)
def test_unknown_workload_field_names_the_line_and_path(tmp_path: Path, keys: tuple[str, ...], path: str):
    workloads = [WORKLOAD, edited(WORKLOAD, *keys, value=1)]

    message = format_error(tmp_path / "p", DEFINITION, workloads)

    assert f"workload.jsonl:2: {path}: Extra inputs are not permitted" in message


@pytest.mark.parametrize(
    ("keys", "value", "path"),
    [
        (("spec", "entry_pont"), "main.py::run", "$.spec.entry_pont"),
        (("spec", "compile_options"), {"cflag": ["-O3"]}, "$.spec.compile_options.cflag"),
        (("sources", 0, "contents"), "", "$.sources[0].contents"),
        (("sourcs",), [], "$.sourcs"),
    ],
)
def test_unknown_solution_field_names_the_path(tmp_path: Path, keys: tuple, value: Any, path: str):
    file = tmp_path / "solution.json"
    file.write_text(json.dumps(edited(SOLUTION, *keys, value=value)))

    with pytest.raises(FormatError) as raised:
        load_solution(file)

    assert f"solution.json: {path}: Extra inputs are not permitted" in str(raised.value)


# Workloads that do not fit their definition.


def test_workload_missing_var_axis(tmp_path: Path):
    message = format_error(tmp_path / "p", DEFINITION, [edited(WORKLOAD, "axes", value={})])

    assert "workload.jsonl:1: $.axes: no value for var axis `n`" in message


def test_workload_value_for_non_var_axis(tmp_path: Path):
    message = format_error(tmp_path / "p", DEFINITION, [edited(WORKLOAD, "axes", "m", value=8)])

    assert "workload.jsonl:1: $.axes.m: only `var` axes take a value" in message


def test_workload_unknown_axis(tmp_path: Path):
    message = format_error(tmp_path / "p", DEFINITION, [edited(WORKLOAD, "axes", "k", value=8)])

    assert "workload.jsonl:1: $.axes.k: not an axis of scale_flatten" in message


def test_workload_unknown_input(tmp_path: Path):
    message = format_error(tmp_path / "p", DEFINITION, [edited(WORKLOAD, "inputs", "z", value={"type": "random"})])

    assert "workload.jsonl:1: $.inputs: inputs do not match the definition" in message
    assert "unknown ['z']" in message


def test_workload_missing_input(tmp_path: Path):
    workload = copy.deepcopy(WORKLOAD)
    del workload["inputs"]["alpha"]

    message = format_error(tmp_path / "p", DEFINITION, [workload])

    assert "missing ['alpha']" in message


def test_workload_mixing_custom_and_random(tmp_path: Path):
    definition = dict(DEFINITION, custom_inputs_entrypoint="make_inputs",
                      reference=DEFINITION["reference"] + "\ndef make_inputs(axes):\n    pass\n")
    workload = edited(WORKLOAD, "inputs", "x", value={"type": "custom"})

    message = format_error(tmp_path / "p", definition, [workload])

    assert "workload.jsonl:1: " in message
    assert "custom inputs ['x'] cannot be mixed with other input types" in message


def test_custom_input_needs_an_entrypoint(tmp_path: Path):
    workload = edited(WORKLOAD, "inputs", value={"x": {"type": "custom"}, "alpha": {"type": "custom"}})

    message = format_error(tmp_path / "p", DEFINITION, [workload])

    assert "workload.jsonl:1: $.inputs.x: custom input but the definition has no custom_inputs_entrypoint" in message


def test_scalar_input_must_be_a_scalar(tmp_path: Path):
    message = format_error(tmp_path / "p", DEFINITION, [edited(WORKLOAD, "inputs", "alpha", value={"type": "random"})])

    assert "workload.jsonl:1: $.inputs.alpha: a scalar (shape null) input must be" in message


def test_duplicate_workload_uuids(tmp_path: Path):
    message = format_error(tmp_path / "p", DEFINITION, [WORKLOAD, WORKLOAD])

    assert "workload.jsonl: duplicate workload uuids" in message


def test_no_workloads(tmp_path: Path):
    assert "workload.jsonl: no workloads" in format_error(tmp_path / "p", DEFINITION, [])


def test_invalid_json_line_names_the_line(tmp_path: Path):
    root = write_problem(tmp_path / "p", DEFINITION, [WORKLOAD])
    with (root / "workload.jsonl").open("a") as handle:
        handle.write("{not json\n")

    with pytest.raises(FormatError, match=r"workload\.jsonl:2: invalid JSON"):
        load_problem(root)


def test_missing_folder(tmp_path: Path):
    with pytest.raises(FormatError, match="not a problem folder"):
        load_problem(tmp_path / "nowhere")


# The reference.


@pytest.mark.parametrize(
    "signature",
    ["def run(x):", "def run(alpha, x):", "def run(x, alpha, beta):", "def run(x, scale):"],
)
def test_reference_run_must_take_the_inputs_in_order(tmp_path: Path, signature: str):
    reference = f"{signature}\n    return x\n"

    message = format_error(tmp_path / "p", dict(DEFINITION, reference=reference), [WORKLOAD])

    assert "definition.json: $.reference: " in message
    assert "does not take the inputs ('x', 'alpha') in order" in message


def test_reference_without_run(tmp_path: Path):
    message = format_error(tmp_path / "p", dict(DEFINITION, reference="def forward(x, alpha):\n    return x\n"),
                           [WORKLOAD])

    assert "reference must define a top-level function `run`" in message


def test_reference_not_python(tmp_path: Path):
    message = format_error(tmp_path / "p", dict(DEFINITION, reference="def run(x, alpha)\n    return x\n"),
                           [WORKLOAD])

    assert "definition.json: " in message
    assert "reference is not valid Python: line 1" in message


def test_tensor_with_undefined_axis(tmp_path: Path):
    definition = edited(DEFINITION, "inputs", "x", "shape", value=["n", "k"])

    message = format_error(tmp_path / "p", definition, [WORKLOAD])

    assert "input `x` uses undefined axis `k`" in message


# Solutions.


def test_solution_loads(tmp_path: Path):
    file = tmp_path / "solution.json"
    file.write_text(json.dumps(SOLUTION))

    solution = load_solution(file)

    assert (solution.entry_file, solution.entry_symbol) == ("main.py", "run")
    assert solution.content_hash() == load_solution(file).content_hash()


@pytest.mark.parametrize("path", ["../main.py", "src/../../main.py", "/etc/passwd", "/main.py", "src\\..\\main.py"])
def test_solution_source_path_must_stay_inside(path: str):
    solution = edited(SOLUTION, "sources", value=[{"path": path, "content": "x = 1\n"}])

    with pytest.raises(FormatError) as raised:
        parse_model(Solution, solution, "solution.json")

    assert "solution.json: $.sources[0].path: " in str(raised.value)
    assert "source path must be relative without `..`" in str(raised.value)


def test_solution_entry_file_must_be_a_source():
    solution = edited(SOLUTION, "spec", "entry_point", value="other.py::run")

    with pytest.raises(FormatError, match="entry file 'other.py' is not among the sources"):
        parse_model(Solution, solution, "solution.json")


def test_seed_solution_for_another_definition(tmp_path: Path):
    root = write_problem(tmp_path / "p", DEFINITION, [WORKLOAD])
    (root / "solutions").mkdir()
    (root / "solutions" / "seed.json").write_text(json.dumps(dict(SOLUTION, definition="other")))

    with pytest.raises(FormatError, match=r"seed\.json: \$\.definition: 'other' is not 'scale_flatten'"):
        load_problem(root)


# Axis expressions.


def axes_definition(axes: dict[str, Any]) -> Definition:
    return Definition.model_validate(dict(DEFINITION, axes=axes, outputs={"y": {"shape": ["n"], "dtype": "float32"}},
                                          inputs={"x": {"shape": ["n"], "dtype": "float32"}},
                                          reference="def run(x):\n    return x\n"))


def test_resolve_axes_computes_expressions_in_dependency_order():
    definition = axes_definition({
        "out": {"type": "expr", "expression": "(height + 2 * padding - kernel) // stride + 1"},
        "double_out": {"type": "expr", "expression": "out * 2"},
        "n": {"type": "var"},
        "height": {"type": "var"},
        "padding": {"type": "const", "value": 1},
        "kernel": {"type": "const", "value": 3},
        "stride": {"type": "const", "value": 2},
    })

    values = definition.resolve_axes({"n": 5, "height": 224})

    assert values == {"n": 5, "height": 224, "padding": 1, "kernel": 3, "stride": 2, "out": 112, "double_out": 224}
    assert all(type(v) is int for v in values.values())


def test_resolve_axes_missing_var():
    definition = axes_definition({"n": {"type": "var"}, "m": {"type": "var"}})

    with pytest.raises(ValueError, match=r"no value for axes \['m'\]"):
        definition.resolve_axes({"n": 1})


def test_resolve_axes_unresolvable_expression():
    definition = axes_definition({"n": {"type": "var"}, "a": {"type": "expr", "expression": "b + 1"},
                                  "b": {"type": "expr", "expression": "a + 1"}})

    with pytest.raises(ValueError, match="cannot resolve axis expressions"):
        definition.resolve_axes({"n": 1})


@pytest.mark.parametrize("expression", ["__import__('os').getpid()", "n.bit_length()", "[n][0]", "n if n else 1"])
def test_resolve_axes_allows_arithmetic_only(expression: str):
    definition = axes_definition({"n": {"type": "var"}, "e": {"type": "expr", "expression": expression}})

    with pytest.raises(ValueError, match="axis expression"):
        definition.resolve_axes({"n": 1})


def test_bad_expression_in_a_workload_is_a_format_error(tmp_path: Path):
    definition = edited(DEFINITION, "axes", "nm", value={"type": "expr", "expression": "n * missing"})

    message = format_error(tmp_path / "p", definition, [WORKLOAD])

    assert "workload.jsonl:1: $.axes: cannot resolve axis expressions" in message


@needs_sample
def test_sample_expression_axes_resolve():
    problem = load_problem(SAMPLE / "L1" / "041_strided_conv2d_downsampling", with_seeds=False)
    expressions = {n: a for n, a in problem.definition.axes.items() if isinstance(a, AxisExpr)}

    values = problem.definition.resolve_axes(problem.workloads[0].axes)

    assert expressions
    assert set(values) == set(problem.definition.axes)
    for name, axis in expressions.items():
        assert values[name] == eval(axis.expression, {}, dict(values))  # noqa: S307 - trusted test data

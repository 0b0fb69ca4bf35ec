"""Definition: the problem's axes, tensors and PyTorch reference (SOL-ExecBench format)."""

from __future__ import annotations

import ast
from enum import Enum
from typing import Annotated, Literal, Union

from pydantic import Field, NonNegativeInt, model_validator

from shared.schema.base import Frozen, NonEmptyStr


class AxisConst(Frozen):
    type: Literal["const"] = "const"
    value: NonNegativeInt
    description: str | None = None


class AxisVar(Frozen):
    type: Literal["var"] = "var"
    description: str | None = None


class AxisExpr(Frozen):
    type: Literal["expr"] = "expr"
    expression: NonEmptyStr
    description: str | None = None


Axis = Annotated[Union[AxisConst, AxisVar, AxisExpr], Field(discriminator="type")]


class DType(str, Enum):
    FLOAT64 = "float64"
    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT8_E4M3FN = "float8_e4m3fn"
    FLOAT8_E5M2 = "float8_e5m2"
    FLOAT4_E2M1 = "float4_e2m1"
    FLOAT4_E2M1FN_X2 = "float4_e2m1fn_x2"
    INT64 = "int64"
    INT32 = "int32"
    INT16 = "int16"
    INT8 = "int8"
    BOOL = "bool"


class TensorSpec(Frozen):
    """`shape` lists axis names (or digit strings); `None` means a Python scalar."""

    shape: list[NonEmptyStr] | None
    dtype: DType
    description: str | None = None


class SolFormula(Frozen):
    """Ours: explicit work of a workload as axis expressions (`"2 * M * N * K"`); either may be
    left out, and the SOL model counts that one from the reference."""

    flops: NonEmptyStr | None = None
    bytes: NonEmptyStr | None = None


class Definition(Frozen):
    name: NonEmptyStr
    description: str | None = None
    op_type: NonEmptyStr | None = None
    hf_id: str | None = None
    tags: list[str] = Field(default_factory=list)
    axes: dict[NonEmptyStr, Axis]
    custom_inputs_entrypoint: NonEmptyStr | None = None
    inputs: dict[NonEmptyStr, TensorSpec]
    outputs: dict[NonEmptyStr, TensorSpec]
    reference: NonEmptyStr
    constraints: list[NonEmptyStr] = Field(default_factory=list)
    sol: SolFormula | None = None

    @model_validator(mode="after")
    def _check(self) -> Definition:
        module = _parse_reference(self.reference)
        functions = {n.name: n for n in module.body if isinstance(n, ast.FunctionDef)}
        if "run" not in functions:
            raise ValueError("reference must define a top-level function `run`")
        entry = self.custom_inputs_entrypoint
        if entry is not None and entry not in functions:
            raise ValueError(f"custom_inputs_entrypoint `{entry}` is not a top-level function of the reference")
        overlap = set(self.inputs) & set(self.outputs)
        if overlap:
            raise ValueError(f"names used as both input and output: {sorted(overlap)}")
        clashes = set(self.inputs) & set(self.axes)
        if clashes:
            raise ValueError(f"input names that are also axis names: {sorted(clashes)}")
        for kind, tensors in (("input", self.inputs), ("output", self.outputs)):
            for name, spec in tensors.items():
                for axis in spec.shape or []:
                    if not axis.isdigit() and axis not in self.axes:
                        raise ValueError(f"{kind} `{name}` uses undefined axis `{axis}`")
        for constraint in self.constraints:
            try:
                ast.parse(constraint, mode="eval")
            except SyntaxError as error:
                raise ValueError(f"constraint {constraint!r} is not a Python expression: {error.msg}") from None
        for key, expression in (("flops", self.sol.flops), ("bytes", self.sol.bytes)) if self.sol else ():
            if expression is not None:
                _check_axis_expression(f"sol.{key}", expression, set(self.axes))
        return self

    def run_parameters(self) -> list[str]:
        """Positional parameter names of the reference's `run`."""
        module = _parse_reference(self.reference)
        run = next(n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "run")
        return [a.arg for a in run.args.posonlyargs + run.args.args]

    def check_run_signature(self) -> None:
        """`run`'s parameters must be the inputs, by name and in order."""
        params, names = self.run_parameters(), list(self.inputs)
        if params != names:
            raise ValueError(f"reference run{tuple(params)} does not take the inputs {tuple(names)} in order")

    def resolve_axes(self, workload_axes: dict[str, int]) -> dict[str, int]:
        """Concrete value of every axis: consts, the workload's vars, then expressions."""
        values = {n: a.value for n, a in self.axes.items() if isinstance(a, AxisConst)}
        missing = [n for n, a in self.axes.items() if isinstance(a, AxisVar) and n not in workload_axes]
        if missing:
            raise ValueError(f"workload gives no value for axes {missing}")
        values.update({n: v for n, v in workload_axes.items() if n in self.axes})
        pending = {n: a.expression for n, a in self.axes.items() if isinstance(a, AxisExpr)}
        while pending:
            progressed = False
            for name, expression in list(pending.items()):
                try:
                    values[name] = int(_evaluate_expression(expression, values))
                except NameError:
                    continue
                del pending[name]
                progressed = True
            if not progressed:
                raise ValueError(f"cannot resolve axis expressions {pending}")
        return values

    def shape_of(self, spec: TensorSpec, axes: dict[str, int]) -> tuple[int, ...] | None:
        if spec.shape is None:
            return None
        return tuple(int(a) if a.isdigit() else axes[a] for a in spec.shape)


def _parse_reference(source: str) -> ast.Module:
    try:
        return ast.parse(source, mode="exec")
    except SyntaxError as error:
        raise ValueError(f"reference is not valid Python: line {error.lineno}: {error.msg}") from None


_ALLOWED_NODES = (
    ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Name, ast.Load,
    ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.UAdd, ast.USub,
)


_FUNCTIONS = {"min": min, "max": max}  # the only calls an expression may make


def _disallowed(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS and not node.keywords:
            return None
        return "a call other than min(...) or max(...)"
    if not isinstance(node, _ALLOWED_NODES):
        return type(node).__name__
    return None


def _names(tree: ast.AST) -> set[str]:
    """The axis names an expression reads (the functions' own names left out)."""
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in called}


def _check_axis_expression(where: str, expression: str, axes: set[str]) -> None:
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as error:
        raise ValueError(f"{where} {expression!r} is not an expression: {error.msg}") from None
    for node in ast.walk(tree):
        bad = _disallowed(node)
        if bad:
            raise ValueError(f"{where} {expression!r} uses {bad}")
    for name in sorted(_names(tree) - axes):
        raise ValueError(f"{where} {expression!r} uses undefined axis `{name}`")


def evaluate_axis_expression(expression: str, values: dict[str, int]) -> float:
    """Arithmetic over axis names only (the `expr` axes and the `sol` formulas)."""
    return _evaluate_expression(expression, values)


def _evaluate_expression(expression: str, values: dict[str, int]) -> float:
    """Arithmetic over axis names only: + - * / // % **, parentheses, min(...) and max(...)."""
    tree = ast.parse(expression, mode="eval")
    for node in ast.walk(tree):
        bad = _disallowed(node)
        if bad:
            raise ValueError(f"axis expression {expression!r} uses {bad}")
    for name in sorted(_names(tree) - set(values)):
        raise NameError(name)
    return eval(compile(tree, "<axis>", "eval"), {"__builtins__": {}, **_FUNCTIONS}, dict(values))  # noqa: S307

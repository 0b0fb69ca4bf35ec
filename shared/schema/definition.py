"""Definition: the problem's axes, tensors and PyTorch reference (SOL-ExecBench format)."""

from __future__ import annotations

import ast
import math
import operator
from enum import Enum
from typing import Annotated, Literal, Union

from pydantic import Field, NonNegativeInt, model_validator

from shared.schema.base import Frozen, NonEmptyStr, shown


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
    """Ours: explicit work of a workload as axis expressions (`"2 * M * N * K"`), which may also
    call `nbytes(T)` (tensor T's bytes at its dtype's size) and `itemsize(T)` (its dtype's bytes per
    element) for any input or output T; either may be left out, and the SOL model counts that one
    from the reference (docs/sol.md)."""

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
            raise ValueError(f"custom_inputs_entrypoint `{shown(entry)}` is not a top-level function of the reference")
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
                        raise ValueError(f"{kind} `{shown(name)}` uses undefined axis `{shown(axis)}`")
        for constraint in self.constraints:
            _parse(constraint, "eval", f"constraint {_quote(constraint)} is not a Python expression")
        for key, expression in (("flops", self.sol.flops), ("bytes", self.sol.bytes)) if self.sol else ():
            if expression is not None:
                _check_axis_expression(f"sol.{key}", expression, set(self.axes), set(self.inputs) | set(self.outputs))
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
                    value = int(_evaluate_expression(expression, values))
                except NameError:
                    continue
                if value < 0:
                    raise ValueError(f"axis `{shown(name)}` = {_quote(expression)} is negative ({value})")
                values[name] = value
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
    return _parse(source, "exec", "reference is not valid Python")


def _quote(text: str, limit: int = 80) -> str:
    """`text` as a repr short enough for a message."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f" (+{len(text) - limit} characters)"


def _parse(source: str, mode: str, what: str) -> ast.AST:
    """`ast.parse`, every way it refuses a text a ValueError: CPython's parser reports nesting too
    deep for its stack as MemoryError or RecursionError, and a NUL character as ValueError."""
    try:
        return ast.parse(source, mode=mode)
    except SyntaxError as error:
        raise ValueError(f"{what}: line {error.lineno}: {error.msg}") from None
    except (MemoryError, RecursionError):
        raise ValueError(f"{what}: nested too deeply") from None
    except ValueError as error:
        raise ValueError(f"{what}: {error}") from None


_ALLOWED_NODES = (
    ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Name, ast.Load,
    ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.UAdd, ast.USub,
)


_FUNCTIONS = {"min": min, "max": max}  # the only calls an expression may make
_TENSOR_FUNCTIONS = ("nbytes", "itemsize")  # and, in `sol` formulas, these of one tensor's name
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPRESSION_VALUE = 2**256  # far above any size or work count; keeps `9**9**9` from eating the CPU


def _disallowed(node: ast.AST, tensors: frozenset[str] | set[str] = frozenset()) -> str | None:
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS and not node.keywords:
            return None
        if _tensor_call(node) and node.args[0].id in tensors:
            return None
        if tensors:
            return "a call other than min(...), max(...), nbytes(TENSOR) or itemsize(TENSOR) of a tensor of the definition"
        return "a call other than min(...) or max(...)"
    if not isinstance(node, _ALLOWED_NODES):
        return type(node).__name__
    return None


def _tensor_call(node: ast.AST) -> bool:
    """`nbytes(T)` or `itemsize(T)`, T a bare name."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _TENSOR_FUNCTIONS
            and not node.keywords and len(node.args) == 1 and isinstance(node.args[0], ast.Name))


def _names(tree: ast.AST) -> set[str]:
    """The axis names an expression reads (the functions' own names and tensor arguments left out)."""
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    called |= {id(n.args[0]) for n in ast.walk(tree) if _tensor_call(n)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in called}


def _check_axis_expression(where: str, expression: str, axes: set[str], tensors: set[str] = frozenset()) -> None:
    tree = _parse(expression, "eval", f"{where} {_quote(expression)} is not an expression")
    for node in ast.walk(tree):
        bad = _disallowed(node, tensors)
        if bad:
            raise ValueError(f"{where} {_quote(expression)} uses {bad}")
    for name in sorted(_names(tree) - axes):
        raise ValueError(f"{where} {_quote(expression)} uses undefined axis `{name}`")


def evaluate_axis_expression(expression: str, values: dict[str, int]) -> float:
    """Arithmetic over axis names only (the `expr` axes)."""
    return _evaluate_expression(expression, values)


def evaluate_sol_expression(expression: str, values: dict[str, int], tensors: dict[str, tuple[int, float]]) -> float:
    """A `sol` formula: arithmetic over axis names, plus `nbytes(T)` and `itemsize(T)` of the tensors
    in `tensors` (name -> (elements, bytes per element))."""
    return _evaluate_expression(expression, values, tensors)


def _evaluate_expression(expression: str, values: dict[str, int],
                         tensors: dict[str, tuple[int, float]] | None = None) -> float:
    """Arithmetic over axis names only: + - * / // % **, parentheses, min(...) and max(...)
    (and a tensor's `nbytes`/`itemsize` when `tensors` are given). A result that is not a finite
    number up to MAX_EXPRESSION_VALUE is a ValueError."""
    tree = _parse(expression, "eval", f"axis expression {_quote(expression)} is not an expression")
    for node in ast.walk(tree):
        bad = _disallowed(node, set(tensors or ()))
        if bad:
            raise ValueError(f"axis expression {_quote(expression)} uses {bad}")
    for name in sorted(_names(tree) - set(values)):
        raise NameError(name)
    try:
        return _value(tree.body, values, tensors or {})
    except (ArithmeticError, TypeError, RecursionError) as error:  # x/0, 10.0**400, min(1), deep trees
        raise ValueError(f"axis expression {_quote(expression)} cannot be evaluated: {error}") from None


def _value(node: ast.AST, values: dict[str, int], tensors: dict[str, tuple[int, float]]) -> float:
    """One checked node of `_evaluate_expression`'s tree, evaluated bottom up."""
    if isinstance(node, ast.Constant):
        if not isinstance(node.value, (int, float)):
            raise TypeError(f"{node.value!r} is not a number")
        result = node.value
    elif isinstance(node, ast.Name):
        result = values[node.id]
    elif isinstance(node, ast.UnaryOp):
        result = _UNARY[type(node.op)](_value(node.operand, values, tensors))
    elif _tensor_call(node):
        elements, itemsize = tensors[node.args[0].id]
        result = elements * itemsize if node.func.id == "nbytes" else itemsize
    elif isinstance(node, ast.Call):
        result = _FUNCTIONS[node.func.id](*(_value(arg, values, tensors) for arg in node.args))
    else:
        left, right = _value(node.left, values, tensors), _value(node.right, values, tensors)
        if isinstance(node.op, ast.Pow) and abs(left) > 1 and abs(right) * math.log2(abs(left)) > 256:
            raise OverflowError(f"{left} ** {right} is too large")
        result = _BINARY[type(node.op)](left, right)
    if isinstance(result, complex) or math.isnan(result) or abs(result) > MAX_EXPRESSION_VALUE:
        raise OverflowError(f"{result!r} is not a finite number up to 2**256")
    return result

"""A problem is a folder: `definition.json`, `workload.jsonl`, optional `solutions/*.json`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from shared.errors import FormatError
from shared.schema.base import child_path, parse_model, read_json, read_jsonl, shown
from shared.schema.definition import AxisVar, Definition, DType
from shared.schema.solution import Solution
from shared.schema.workload import CustomInput, SafetensorsInput, ScalarInput, Workload


@dataclass(frozen=True)
class Problem:
    definition: Definition
    workloads: tuple[Workload, ...]
    root: Path | None = None
    seeds: tuple[Solution, ...] = field(default=())

    @property
    def name(self) -> str:
        return self.definition.name

    def seed(self, language: str = "pytorch") -> Solution:
        """The first seed solution in `language` (a problem may ship one per language)."""
        for solution in self.seeds:
            if language in {item.value for item in solution.spec.languages}:
                return solution
        raise LookupError(f"problem {self.name} has no {language} seed")


def load_problem(root: Path, with_seeds: bool = True) -> Problem:
    """Load and cross-check a problem folder. Runs nothing; any mistake is a FormatError."""
    root = Path(root)
    if not root.is_dir():
        raise FormatError(f"{root}: not a problem folder")
    def_path = root / "definition.json"
    definition = parse_model(Definition, read_json(def_path), str(def_path))
    try:
        definition.check_run_signature()
    except ValueError as error:
        raise FormatError(f"{def_path}: $.reference: {error}") from None
    wl_path = root / "workload.jsonl"
    workloads = []
    for number, data in read_jsonl(wl_path):
        source = f"{wl_path}:{number}"
        workload = parse_model(Workload, data, source)
        check_workload(definition, workload, source)
        workloads.append(workload)
    if not workloads:
        raise FormatError(f"{wl_path}: no workloads")
    uuids = [w.uuid for w in workloads]
    if len(set(uuids)) != len(uuids):
        raise FormatError(f"{wl_path}: duplicate workload uuids")
    seeds = tuple(_load_seeds(root, definition)) if with_seeds else ()
    return Problem(definition, tuple(workloads), root, seeds)


def check_workload(definition: Definition, workload: Workload, source: str) -> None:
    """The workload must fit the definition: every var axis, exactly the inputs, sane types."""
    def fail(path: str, message: str) -> None:
        raise FormatError(f"{source}: {path}: {message}")

    for name in workload.axes:
        if name not in definition.axes:
            fail(child_path("$.axes", name), f"not an axis of {definition.name}")
        elif not isinstance(definition.axes[name], AxisVar):
            fail(child_path("$.axes", name), "only `var` axes take a value in a workload")
    for name, axis in definition.axes.items():
        if isinstance(axis, AxisVar) and name not in workload.axes:
            fail("$.axes", f"no value for var axis `{shown(name)}`")
    if set(workload.inputs) != set(definition.inputs):
        missing = sorted(set(definition.inputs) - set(workload.inputs))
        extra = sorted(set(workload.inputs) - set(definition.inputs))
        fail("$.inputs", f"inputs do not match the definition (missing {missing}, unknown {extra})")
    for name, spec in workload.inputs.items():
        if isinstance(spec, CustomInput) and definition.custom_inputs_entrypoint is None:
            fail(child_path("$.inputs", name), "custom input but the definition has no custom_inputs_entrypoint")
        if definition.inputs[name].shape is None and not isinstance(spec, (ScalarInput, CustomInput)):
            fail(child_path("$.inputs", name), "a scalar (shape null) input must be `scalar` or `custom`")
    try:
        definition.resolve_axes(workload.axes)
    except ValueError as error:
        fail("$.axes", str(error))


# Bytes a tensor element takes where the evaluator makes it (FP4 is held a byte a value, or two values
# to a byte for the packed x2 type).
DTYPE_BYTES = {DType.FLOAT64: 8, DType.FLOAT32: 4, DType.FLOAT16: 2, DType.BFLOAT16: 2, DType.FLOAT8_E4M3FN: 1,
               DType.FLOAT8_E5M2: 1, DType.FLOAT4_E2M1: 1, DType.FLOAT4_E2M1FN_X2: 1, DType.INT64: 8,
               DType.INT32: 4, DType.INT16: 2, DType.INT8: 1, DType.BOOL: 1}


def tensor_bytes(definition: Definition, workload: Workload) -> dict[str, int]:
    """Bytes of each input and output tensor of `workload` (its axes resolved), by name."""
    axes = definition.resolve_axes(workload.axes)
    sizes = {}
    for name, spec in (*definition.inputs.items(), *definition.outputs.items()):
        shape = definition.shape_of(spec, axes)
        if shape is not None:
            sizes[name] = math.prod(shape) * DTYPE_BYTES[spec.dtype]
    return sizes


def oversized(problem: Problem, max_bytes: int) -> list[str]:
    """A line for each workload whose tensors (one input set and its outputs) take more than
    `max_bytes` together, naming the largest of them with their bytes; empty when all fit. The
    evaluator holds several such sets at once (correctness rounds, timed sets, expected outputs),
    so a workload over the budget would exhaust an evaluator's memory, not just be slow."""
    lines = []
    for number, workload in enumerate(problem.workloads, 1):
        sizes = tensor_bytes(problem.definition, workload)
        total = sum(sizes.values())
        if total > max_bytes:
            largest = sorted(sizes.items(), key=lambda item: -item[1])[:3]
            named = ", ".join(f"`{shown(n)}` {_gib(b)}" for n, b in largest)
            lines.append(f"workload {number} ({shown(workload.uuid)}): its tensors take {_gib(total)}, over the "
                         f"budget of {_gib(max_bytes)} (KERNELSWARM_MAX_WORKLOAD_BYTES); largest: {named}")
    return lines


def missing_data_files(problem: Problem) -> list[str]:
    """A line for each safetensors file that workloads name as input data and that is not there (a
    relative path is taken from the problem's folder), with the inputs and workloads that need it;
    empty when all are there. Without those files the evaluator cannot make the workloads' inputs."""
    needed: dict[str, tuple[dict[int, str], dict[str, None]]] = {}  # path -> (number -> uuid, input names)
    for number, workload in enumerate(problem.workloads, 1):
        for name, spec in workload.inputs.items():
            if isinstance(spec, SafetensorsInput):
                workloads, inputs = needed.setdefault(spec.path, ({}, {}))
                workloads[number] = workload.uuid
                inputs[name] = None
    lines = []
    for path, (workloads, inputs) in needed.items():
        file = Path(path) if Path(path).is_absolute() or problem.root is None else problem.root / path
        if file.is_file():
            continue
        (number, uuid), *others = workloads.items()
        names = ", ".join(f"`{shown(name)}`" for name in inputs)
        more = f" and {len(others)} more workload{'s' if len(others) > 1 else ''}" if others else ""
        lines.append(f"{shown(path, 1000)}: no such file (safetensors data of {names} in workload {number} "
                     f"({shown(uuid)}){more})")
    return lines


def _gib(nbytes: int) -> str:
    return f"{nbytes:,} bytes ({nbytes / 2**30:.2f} GiB)"


def load_solution(path: Path) -> Solution:
    return parse_model(Solution, read_json(Path(path)), str(path))


def _load_seeds(root: Path, definition: Definition) -> list[Solution]:
    seeds = []
    for path in sorted((root / "solutions").glob("*.json")):
        solution = load_solution(path)
        if solution.definition != definition.name:
            raise FormatError(f"{path}: $.definition: {solution.definition!r} is not {definition.name!r}")
        seeds.append(solution)
    return seeds


def find_problems(roots: list[Path]) -> list[Path]:
    """Problem folders at or below each root (a folder holding definition.json)."""
    found = []
    for root in roots:
        root = Path(root)
        if (root / "definition.json").exists():
            found.append(root)
        elif root.is_dir():
            found.extend(sorted(p.parent for p in root.rglob("definition.json")))
        else:
            raise FormatError(f"{root}: no such problem folder")
    return found

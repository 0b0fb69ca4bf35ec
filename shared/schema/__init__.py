"""Problem, solution and trace schemas, field for field compatible with SOL-ExecBench."""

from shared.schema.base import parse_model
from shared.schema.definition import AxisConst, AxisExpr, AxisVar, Definition, DType, TensorSpec
from shared.schema.problem import Problem, load_problem, load_solution, missing_data_files, oversized, tensor_bytes
from shared.schema.solution import BuildSpec, Hardware, Language, Solution, SourceFile
from shared.schema.trace import (
    AttemptInfo,
    Correctness,
    Environment,
    Evaluation,
    Performance,
    SolScore,
    Status,
    Timing,
    Trace,
)
from shared.schema.workload import CustomInput, RandomInput, SafetensorsInput, ScalarInput, Tolerance, Workload

__all__ = [
    "AttemptInfo", "AxisConst", "AxisExpr", "AxisVar", "BuildSpec", "Correctness", "CustomInput",
    "DType", "Definition", "Environment", "Evaluation", "Hardware", "Language", "Performance",
    "Problem", "RandomInput", "SafetensorsInput", "ScalarInput", "SolScore", "Solution", "SourceFile",
    "Status", "TensorSpec", "Timing", "Tolerance", "Trace", "Workload", "load_problem", "load_solution",
    "missing_data_files", "oversized", "parse_model", "tensor_bytes",
]

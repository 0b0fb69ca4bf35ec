"""Solution: a candidate's sources and build spec (SOL-ExecBench format plus our additions)."""

from __future__ import annotations

import hashlib
import json
from enum import Enum
from pathlib import PurePosixPath

from pydantic import Field, field_validator, model_validator

from shared.schema.base import Frozen, NonEmptyStr

MAX_SOURCE_BYTES = 1 << 20  # per file
MAX_SOURCES = 64


class Language(str, Enum):
    # SOL-ExecBench's languages (Python side, then C++ side).
    PYTORCH = "pytorch"
    TRITON = "triton"
    TLX = "tlx"
    CUTE_DSL = "cute_dsl"
    CUTILE = "cutile"
    CUDNN_FRONTEND = "cudnn_frontend"
    CUTLASS = "cutlass"
    CUDNN = "cudnn"
    CUBLAS = "cublas"
    CUDA_CPP = "cuda_cpp"
    # Ours: nvcc -> cubin launched through pycuda, and a C++ shared library for the CPU.
    CUDA = "cuda"
    CPP = "cpp"


class Hardware(str, Enum):
    B200 = "B200"
    H100 = "H100"
    H200 = "H200"
    LOCAL = "LOCAL"
    CPU = "CPU"


class Binding(str, Enum):
    TORCH = "torch"


class SourceFile(Frozen):
    path: NonEmptyStr
    content: NonEmptyStr

    @field_validator("path")
    @classmethod
    def _relative(cls, path: str) -> str:
        parts = PurePosixPath(path)
        if parts.is_absolute() or ".." in parts.parts or "\\" in path:
            raise ValueError(f"source path must be relative without `..`: {path!r}")
        return path

    @field_validator("content")
    @classmethod
    def _size(cls, content: str) -> str:
        if len(content.encode()) > MAX_SOURCE_BYTES:
            raise ValueError(f"source file larger than {MAX_SOURCE_BYTES} bytes")
        return content


class CompileOptions(Frozen):
    cflags: list[str] = Field(default_factory=list)
    cuda_cflags: list[str] = Field(default_factory=list)
    ld_flags: list[str] = Field(default_factory=list)


class BuildSpec(Frozen):
    """`tunables` (ours): `{NAME: [values...]}`; a choice becomes `-D NAME=value` for C/CUDA
    sources and a module constant for Python ones."""

    languages: list[Language] = Field(min_length=1)
    target_hardware: list[Hardware] = Field(min_length=1)
    entry_point: NonEmptyStr
    dependencies: list[NonEmptyStr] = Field(default_factory=list)
    destination_passing_style: bool = True
    binding: Binding | None = None
    compile_options: CompileOptions | None = None
    tunables: dict[NonEmptyStr, list[bool | int | float | str]] = Field(default_factory=dict)
    tunable_values: dict[NonEmptyStr, bool | int | float | str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> BuildSpec:
        if self.entry_point.count("::") != 1:
            raise ValueError(f"entry_point must be `<file>::<function>`, got {self.entry_point!r}")
        for name, values in self.tunables.items():
            if not name.isidentifier() or not values:
                raise ValueError(f"tunable {name!r} needs an identifier name and at least one value")
        for name, value in self.tunable_values.items():
            if name not in self.tunables or value not in self.tunables[name]:
                raise ValueError(f"tunable value {name}={value!r} is not one of spec.tunables")
        return self

    @property
    def language(self) -> Language:
        """The language that decides how the solution is built and launched."""
        for language in (Language.CUDA, Language.CPP, Language.CUDA_CPP):
            if language in self.languages:
                return language
        return self.languages[0]


class Solution(Frozen):
    name: NonEmptyStr
    definition: NonEmptyStr
    author: NonEmptyStr
    spec: BuildSpec
    sources: list[SourceFile] = Field(min_length=1, max_length=MAX_SOURCES)
    description: str | None = None

    @model_validator(mode="after")
    def _check(self) -> Solution:
        paths = [s.path for s in self.sources]
        duplicates = sorted({p for p in paths if paths.count(p) > 1})
        if duplicates:
            raise ValueError(f"duplicate source paths {duplicates}")
        if self.entry_file not in paths:
            raise ValueError(f"entry file {self.entry_file!r} is not among the sources")
        return self

    @property
    def entry_file(self) -> str:
        return self.spec.entry_point.split("::")[0]

    @property
    def entry_symbol(self) -> str:
        return self.spec.entry_point.split("::")[1]

    def canonical_json(self) -> bytes:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":")).encode()

    def content_hash(self) -> str:
        """SHA-256 of the canonical JSON: the solution's identity in the DB and object store."""
        return hashlib.sha256(self.canonical_json()).hexdigest()

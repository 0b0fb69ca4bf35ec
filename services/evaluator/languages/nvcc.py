"""Language `cuda`: nvcc builds all of a solution's `.cu` files into one cubin.

The build key is the SHA-256 of everything that decides the cubin (sources, flags, tunables, target
architecture, nvcc's version); a cubin already in the cache under that key is reused, so building
the same candidate twice calls no compiler. Runs wherever nvcc is; needs no GPU.

A solution's text drives the compiler, so the build is untrusted work: its options pass an
allow-list first (`flags`), the preprocessor's pass says which files it opened and any outside the
solution's folder, the toolkit and the system headers refuses the build (`includes`), and every
compiler run is confined like a candidate (`isolation.run_confined`: its own folder writable,
nothing else, no network, no capabilities or `nobody`). Its messages never carry a file outside
(`includes.compiler_excerpt`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Protocol

from services.evaluator.languages import Built
from services.evaluator.languages.flags import refused_build, without_ptxas
from services.evaluator.languages.includes import MAX_LOG_CHARS  # noqa: F401 - callers read nvcc.MAX_LOG_CHARS
from services.evaluator.languages.includes import (check_includes, compiler_excerpt, read_output, readable_roots,
                                                   toolkit_env)
from services.evaluator.sandbox.isolation import run_confined
from shared.schema import Solution

CUBIN_FILE = "kernels.cubin"  # in the solution's folder, where the candidate's `kernels` handle reads it
BUILD_TIMEOUT_S = 120.0
UNITY_FILE = "__kernelswarm_unity.cu"
BASE_FLAGS = ("-O3", "-lineinfo", "-std=c++17")
# Compute capability -> the target the cubin is built for ("a" targets unlock wgmma, tcgen05...).
ARCHES = {(9, 0): "sm_90a", (10, 0): "sm_100a", (8, 0): "sm_80", (8, 6): "sm_86", (8, 9): "sm_89",
          (12, 0): "sm_120a"}


class BuildCache(Protocol):
    def get_build(self, key: str) -> bytes | None: ...
    def put_build(self, key: str, data: bytes) -> None: ...


@dataclass(frozen=True)
class Cubin:
    ok: bool
    key: str
    log: str  # on failure: the part of nvcc's output an agent needs
    cubin: bytes = b""
    cached: bool = False
    seconds: float = 0.0


def arch_for(capability: tuple[int, int]) -> str:
    return ARCHES.get(tuple(capability), f"sm_{capability[0]}{capability[1]}")


def gencode(arch: str) -> str:
    """`-gencode` form: `-arch=sm_90a` alone also runs a plain sm_90 pass that rejects wgmma."""
    number = arch.removeprefix("sm_")
    return f"-gencode=arch=compute_{number},code=sm_{number}"


@lru_cache(maxsize=1)
def nvcc_version() -> str:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return ""
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
    return out.strip().splitlines()[-1] if out.strip() else "unknown"


def define_flags(tunables: dict[str, object]) -> list[str]:
    flags = []
    for name, value in sorted(tunables.items()):
        if isinstance(value, bool):
            value = int(value)
        flags.append(f"-D{name}={value}")
    return flags


def build_key(solution: Solution, arch: str, tunables: dict[str, object]) -> str:
    sources = sorted((s.path, s.content) for s in solution.sources if not s.path.endswith(".py"))
    flags = solution.spec.compile_options.cuda_cflags if solution.spec.compile_options else []
    blob = json.dumps({"sources": sources, "flags": [*BASE_FLAGS, *flags, *define_flags(tunables)],
                       "arch": arch, "nvcc": nvcc_version()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def build(solution: Solution, target: Path, tunables: dict[str, object], arch: str,
          cache: BuildCache | None = None) -> Built:
    """The registry's build step for `cuda`: the cubin, saved into the solution's folder."""
    cubin = build_cubin(solution, arch, tunables, target.parent / "nvcc", cache)
    if not cubin.ok:
        return Built(False, cubin.log, seconds=cubin.seconds)
    (target / CUBIN_FILE).write_bytes(cubin.cubin)
    return Built(True, artifact=target / CUBIN_FILE, seconds=cubin.seconds, cached=cubin.cached)


def build_cubin(solution: Solution, arch: str, tunables: dict[str, object], workdir: Path,
                cache: BuildCache | None = None, timeout_s: float = BUILD_TIMEOUT_S) -> Cubin:
    """Compile every `.cu` source as one translation unit into `workdir/kernels.cubin`."""
    key = build_key(solution, arch, tunables)
    started = time.monotonic()
    hit = from_cache(cache, key)
    if hit is not None:
        return hit
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return Cubin(False, key, "nvcc is not on PATH on this evaluator")
    units = [s.path for s in solution.sources if s.path.endswith(".cu")]
    if not units:
        return Cubin(False, key, "a `cuda` solution needs at least one .cu source")
    flags = nvcc_flags(solution, arch, tunables)
    why = refused_build(solution, define_flags(tunables))
    if why:
        return Cubin(False, key, why)
    log = compile_confined(nvcc, solution, flags, workdir, timeout_s)
    seconds = time.monotonic() - started
    data = read_output(workdir / CUBIN_FILE, workdir) if log is None else None
    if data is None:
        return Cubin(False, key, log or "nvcc made no cubin", seconds=seconds)
    if cache is not None:
        cache.put_build(key, data)
    return Cubin(True, key, "", data, seconds=seconds)


def nvcc_flags(solution: Solution, arch: str, tunables: dict[str, object]) -> list[str]:
    """nvcc's options for a cubin of `solution` (the allow-list checks the solution's part: `flags`)."""
    extra = solution.spec.compile_options.cuda_cflags if solution.spec.compile_options else []
    return [gencode(arch), *BASE_FLAGS, *extra, *define_flags(tunables)]


def compile_confined(nvcc: str, solution: Solution, flags: list[str], workdir: Path, timeout_s: float,
                     output: list[str] | None = None) -> str | None:
    """Write the sources and their one translation unit into `workdir`, check what the
    preprocessor opens (`flags` but ptxas's), then run nvcc with `flags` there, confined, into
    `CUBIN_FILE`; None where it made it, else the COMPILE_ERROR's message. `output`: nvcc's own
    output is appended to it."""
    write_sources(solution, workdir)
    units = [s.path for s in solution.sources if s.path.endswith(".cu")]
    (workdir / UNITY_FILE).write_text("".join(f'#include "{unit}"\n' for unit in units))
    roots = readable_roots(nvcc)
    refused = check_includes([nvcc, *without_ptxas(flags)], UNITY_FILE, workdir, timeout_s, roots, toolkit_env(nvcc))
    if refused is not None:
        return refused
    done = run_confined([nvcc, "-cubin", *flags, "-o", CUBIN_FILE, UNITY_FILE], workdir, timeout_s,
                        env=toolkit_env(nvcc))
    if output is not None:
        output.append(done.output)
    if done.timed_out:
        return f"nvcc ran past {timeout_s:.0f} s and was stopped"
    if done.exit_code != 0:
        return compiler_excerpt(done.output, workdir, roots)
    return None


def from_cache(cache: BuildCache | None, key: str) -> Cubin | None:
    """The build stored under `key`, or None (no cache, or not built yet)."""
    started = time.monotonic()
    data = cache.get_build(key) if cache is not None else None
    if data is None:
        return None
    return Cubin(True, key, "", data, cached=True, seconds=time.monotonic() - started)


def write_sources(solution: Solution, folder: Path) -> None:
    """Every source file of the solution under `folder`, at its relative path."""
    folder.mkdir(parents=True, exist_ok=True)
    for source in solution.sources:
        path = folder / source.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source.content)

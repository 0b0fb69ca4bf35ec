"""Language `cuda_cpp` (SOL-ExecBench's torch binding): the `.cu` and `.cpp` sources become one Python
extension module, built by torch's `cpp_extension` (ninja, nvcc and the host compiler against torch's
headers) in a process of its own, and cached by build key like a cubin. The candidate child imports
the module and calls the entry point's symbol from it.

The sources bind their functions with `PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)`. A build needs
torch's CUDA headers, nvcc and ninja, so it runs on GPU machines; it takes about a minute, most of it
compiling torch's headers (`torch/extension.h`), which is why agents are steered to `cuda`.

The build is untrusted work as nvcc's is (`nvcc.py`): options allow-listed (`flags`, all three
lists), each source's preprocessor pass checked for files opened outside the solution's folder, the
toolkit, the system headers and torch's and Python's headers (`includes`), and the build's
interpreter (with ninja, nvcc and the host compiler it starts) confined like a candidate
(`isolation.run_confined`).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import shutil
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

from services.evaluator.languages import Built
from services.evaluator.protocol import CandidateJob
from services.evaluator.languages.flags import refused_build
from services.evaluator.languages.includes import (check_includes, compiler_excerpt, read_output, readable_roots,
                                                   toolkit_env)
from services.evaluator.languages.nvcc import BuildCache, Cubin, define_flags, from_cache, nvcc_version, write_sources
from services.evaluator.sandbox.isolation import run_confined
from shared.schema import Solution

BUILD_TIMEOUT_S = 900.0
SOURCE_SUFFIXES = (".cu", ".cpp", ".cc", ".cxx")
_BUILD = """
import json, sys
from torch.utils.cpp_extension import load
a = json.loads(sys.argv[1])
load(name=a["name"], sources=a["sources"], build_directory=a["build"], extra_cflags=a["cflags"],
     extra_cuda_cflags=a["cuda_cflags"], verbose=True, is_python_module=True)
"""


def extension_key(solution: Solution, arch: str, tunables: dict[str, object]) -> str:
    import torch

    sources = sorted((s.path, s.content) for s in solution.sources if not s.path.endswith(".py"))
    options = solution.spec.compile_options
    blob = json.dumps({"kind": "cuda_cpp", "sources": sources, "tunables": define_flags(tunables), "arch": arch,
                       "cflags": options.cflags if options else [], "cuda_cflags": options.cuda_cflags if options else [],
                       "nvcc": nvcc_version(), "torch": torch.__version__}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def module_name(key: str) -> str:
    return f"ks_ext_{key[:20]}"


def build(solution: Solution, target: Path, tunables: dict[str, object], arch: str,
          cache: BuildCache | None = None) -> Built:
    """The registry's build step for `cuda_cpp`: the extension module, saved into the solution's
    folder under its module name (the file name is what Python imports it by)."""
    built = build_extension(solution, arch, tunables, target.parent / "torchext", cache)
    if not built.ok:
        return Built(False, built.log, seconds=built.seconds)
    library = target / f"{module_name(built.key)}.so"
    library.write_bytes(built.cubin)
    return Built(True, artifact=library, seconds=built.seconds, cached=built.cached)


def load(entry: Any, job: CandidateJob) -> Any:
    """In the candidate's child: the entry is a function of the built extension module (the entry
    point's file is C++; there is no Python entry)."""
    library = Path(job.artifact_path)
    symbol = job.entry_symbol
    loader = importlib.machinery.ExtensionFileLoader(library.stem, str(library))
    spec = importlib.util.spec_from_loader(library.stem, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    function = getattr(module, symbol, None)
    if not callable(function):
        raise AttributeError(f"the extension defines no function `{symbol}` (bind it with "
                             f"PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{ m.def(\"{symbol}\", ...); }})")
    return function


def build_extension(solution: Solution, arch: str, tunables: dict[str, object], workdir: Path,
                    cache: BuildCache | None = None, timeout_s: float = BUILD_TIMEOUT_S) -> Cubin:
    """Build (or fetch from the cache) the solution's extension module; `Cubin.cubin` holds the
    shared library's bytes, to be saved as `<module_name(key)>.so`."""
    key = extension_key(solution, arch, tunables)
    started = time.monotonic()
    hit = from_cache(cache, key)
    if hit is not None:
        return hit
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return Cubin(False, key, "nvcc is not on PATH on this evaluator")
    units = [s.path for s in solution.sources if s.path.endswith(SOURCE_SUFFIXES)]
    if not units:
        return Cubin(False, key, "a `cuda_cpp` solution needs .cu or .cpp sources")
    why = refused_build(solution, define_flags(tunables))
    if why:
        return Cubin(False, key, why)
    source_dir, build_dir = workdir / "src", workdir / "build"
    build_dir.mkdir(parents=True, exist_ok=True)
    write_sources(solution, source_dir)
    options = solution.spec.compile_options
    name = module_name(key)
    job = {"name": name, "sources": [str(source_dir / u) for u in units], "build": str(build_dir),
           "cflags": ["-O3", *(options.cflags if options else []), *define_flags(tunables)],
           "cuda_cflags": ["-O3", *(options.cuda_cflags if options else []), *define_flags(tunables)]}
    roots = readable_roots(nvcc, header_folders())
    refused = opened_outside(nvcc, job, units, workdir, timeout_s, roots, arch)
    if refused is not None:
        return Cubin(False, key, refused, seconds=time.monotonic() - started)
    done = run_confined([sys.executable, "-c", _BUILD, json.dumps(job)], workdir, timeout_s, env=_build_env(nvcc, arch))
    seconds = time.monotonic() - started
    if done.timed_out:
        return Cubin(False, key, f"the extension build ran past {timeout_s:.0f} s and was stopped", seconds=seconds)
    data = read_output(build_dir / f"{name}.so", workdir) if done.exit_code == 0 else None
    if data is None:
        return Cubin(False, key, compiler_excerpt(done.output, source_dir, roots), seconds=seconds)
    if cache is not None:
        cache.put_build(key, data)
    return Cubin(True, key, "", data, seconds=seconds)


def header_folders() -> list[Path]:
    """torch's and Python's headers, which an extension's sources include (beside the toolkit's)."""
    from torch.utils.cpp_extension import include_paths

    return [Path(p) for p in (*include_paths(), sysconfig.get_paths()["include"])]


def opened_outside(nvcc: str, job: dict, units: list[str], workdir: Path, timeout_s: float,
                   roots: tuple[str, ...], arch: str) -> str | None:
    """Each source's preprocessor pass (nvcc's for `.cu`, the host compiler's for the others, with
    torch's and Python's include folders), confined: the COMPILE_ERROR's message where one opened
    a file outside the solution's folder and `roots` (`includes.check_includes`), else None."""
    headers = [f"-I{p}" for p in header_folders()]
    for unit, path in zip(units, job["sources"]):
        compiler = [nvcc, *job["cuda_cflags"]] if unit.endswith(".cu") else ["c++", *job["cflags"]]
        relative = os.path.relpath(path, workdir)
        refused = check_includes([*compiler, *headers, "-DTORCH_EXTENSION_NAME=" + job["name"]], relative, workdir,
                                 timeout_s, roots, _build_env(nvcc, arch))
        if refused is not None:
            return refused
    return None


def _build_env(nvcc: str, arch: str) -> dict[str, str]:
    """The confined build's environment over `scrubbed_env`: the toolkit's (`toolkit_env`) with
    this interpreter's folder on PATH (ninja may be installed there), the architecture, the jobs."""
    env = toolkit_env(nvcc)
    number = arch.removeprefix("sm_")
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    env["TORCH_CUDA_ARCH_LIST"] = f"{number[:-2]}.{number[-2:]}" if len(number) > 2 else f"{number[0]}.{number[1:]}"
    env["MAX_JOBS"] = os.environ.get("MAX_JOBS", str(os.cpu_count() or 4))
    return env

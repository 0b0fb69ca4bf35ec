"""The compile options a solution may pass: an allow-list, checked before any compiler runs.

A solution's `spec.compile_options` go onto a compiler's command line (nvcc for `cuda`, torch's
extension build for `cuda_cpp`, the `inspect` tool's nvcc). A compiler's options can run programs
(`-Xcompiler -specs=...`, `-ccbin`), read files (`-include`, `-I/abs`, `@file`), write files (`-o`,
`--keep-dir`) or pick the target (`-arch`, `-gencode`: the evaluator's). So only options known to
change nothing but the code made pass (optimisation, register limits, fast math and its parts, line
info, defines, the language standard, relative include folders inside the solution, ptxas's own
short list); any other is refused by name, with COMPILE_ERROR, before anything runs. The schema
keeps loading any list (SOL-ExecBench's solutions load unchanged): the check is the build's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from shared.schema import Language, Solution
from shared.schema.solution import CompileOptions

_NAME = r"[A-Za-z_]\w*"
_VALUE = r"[\w.+\-]*"  # no quotes, spaces or shell characters: nvcc hands defines on through a shell
_BOOL = r"=(true|false)"
_RELATIVE = r"(?!/)(?!-)(?!.*(^|/)\.\.(/|$))[\w.\-/]+"  # a folder inside the solution's: no `..`, not absolute
NVCC_FLAGS = re.compile("|".join((
    r"-O[0-3]", r"--?optimize=[0-3]", r"-lineinfo", r"--generate-line-info",
    r"--?use[_-]fast[_-]math", rf"--?ftz{_BOOL}", rf"--?prec-div{_BOOL}", rf"--?prec-sqrt{_BOOL}",
    rf"--?fmad{_BOOL}", r"--?maxrregcount=\d{1,3}", r"--?expt-relaxed-constexpr", r"--?expt-extended-lambda",
    r"--?extended-lambda", r"--?std=c\+\+(17|20)", rf"-D{_NAME}(={_VALUE})?", rf"-U{_NAME}", rf"-I{_RELATIVE}",
    rf"--include-path={_RELATIVE}", r"-w", r"--disable-warnings", r"-Wno-deprecated-gpu-targets",
    r"--?restrict", r"--?res(ource)?-usage", r"--?diag-suppress=\d+(,\d+)*", r"--display-error-number")))
PTXAS_FLAGS = re.compile("|".join((
    r"-v", r"--verbose", r"-O[0-3]", r"--warn-on-spills", r"-warn-spills", r"--warn-on-local-memory-usage",
    r"-warn-lmem-usage", r"--warn-on-double-precision-use", r"-warn-double-usage",
    rf"--allow-expensive-optimizations{_BOOL}", r"--?maxrregcount=\d{1,3}", r"--def-load-cache=(ca|cg|cs|lu|cv)",
    r"--def-store-cache=(wb|cg|cs|wt)")))
HOST_FLAGS = re.compile("|".join((
    r"-O[0-3s]", r"-Ofast", r"--?std=c\+\+(17|20)", rf"-D{_NAME}(={_VALUE})?", rf"-U{_NAME}", rf"-I{_RELATIVE}",
    r"-ffast-math", r"-funroll-loops", r"-fno-strict-aliasing", r"-march=native", r"-mtune=native", r"-g", r"-w",
    r"-Wall", r"-Wextra", r"-Wno-[\w\-]+", r"-fopenmp")))
LINK_FLAGS = re.compile(r"-l(cuda|cudart|cublas|cublasLt|curand|cufft|cusparse|cusolver|nvrtc|nvToolsExt|gomp)")
HOST_SUMMARY = ("-O0..3, -Ofast, -std=c++17/20, defines (-D/-U), relative include folders inside the solution (-I), "
                "-ffast-math, -funroll-loops, -march=native, warnings, -g, -fopenmp")
# Options whose value is the next word on the command line.
SEPARATE = {"-D", "-U", "-I", "--include-path", "-maxrregcount", "--maxrregcount", "-Xptxas", "--ptxas-options"}
ARCHITECTURE = re.compile(r"(-arch|--gpu-architecture|-gencode|--generate-code|-code|--gpu-code)(=.*)?")
ALLOWED_SUMMARY = ("optimisation levels, register limits (-maxrregcount), fast math and its parts (--use_fast_math, "
                   "-ftz, -prec-div, -prec-sqrt, -fmad), -lineinfo, defines (-D/-U), -std=c++17/20, "
                   "--expt-relaxed-constexpr, --expt-extended-lambda, relative include folders inside the "
                   "solution (-I), -Xptxas with -v, -O0..3, --warn-on-spills and the like")


SOURCE_PATH = re.compile(r"[\w.\-/]+")  # a file name the compilers (and ninja's build file) take as it is
DEFINE = re.compile(rf"-D{_NAME}={_VALUE}")


def refused_build(solution: Solution, defines: Sequence[str]) -> str | None:
    """Why `solution` may not be built (the first refused option, tunable define or source file
    name), or None. `defines`: its tunables as `-DNAME=value`, which go onto the command line too."""
    why = refused_options(solution.spec.compile_options, solution.spec.language)
    if why:
        return why
    bad = next((flag for flag in defines if not DEFINE.fullmatch(flag)), None)
    if bad is not None:
        return f"tunable `{bad[2:]}` refused: a value of letters, digits and . + - _ only"
    path = next((s.path for s in solution.sources if not SOURCE_PATH.fullmatch(s.path)), None)
    if path is not None:
        return f"source file name {path!r} refused: letters, digits and . - _ / only"
    return None


def refused_options(options: CompileOptions | None, language: Language) -> str | None:
    """Why `options` may not be used for a `language` build (the first refused option, named), or
    None: all of them are allowed. `cuda` uses only `cuda_cflags`; `cuda_cpp` all three lists."""
    if options is None:
        return None
    lists = [("cuda_cflags", options.cuda_cflags, refused_nvcc)]
    if language is Language.CUDA_CPP:
        lists += [("cflags", options.cflags, refused_host), ("ld_flags", options.ld_flags, refused_link)]
    for name, flags, check in lists:
        why = check(flags)
        if why:
            return f"compile_options.{name}: {why}"
    return None


def refused_nvcc(flags: Sequence[str]) -> str | None:
    """The first of nvcc's `flags` that is not on the allow-list, with why; None: all allowed."""
    for flag, value in _pairs(flags):
        if ARCHITECTURE.fullmatch(flag):
            return f"option `{flag}` refused: the target architecture is the evaluator's to choose"
        if flag in ("-Xptxas", "--ptxas-options") or flag.startswith(("-Xptxas=", "--ptxas-options=")):
            inner = value if value is not None else flag.split("=", 1)[1]
            bad = next((part for part in inner.split(",") if not PTXAS_FLAGS.fullmatch(part)), None)
            if bad is not None or not inner:
                return (f"ptxas option `{bad or inner}` (in `{flag}`) refused: allowed are -v, -O0..3, "
                        f"--warn-on-spills and the like")
            continue
        joined = flag if value is None else _joined(flag, value)
        if not NVCC_FLAGS.fullmatch(joined):
            return _refusal(flag if value is None else f"{flag} {value}")
    return None


def refused_host(flags: Sequence[str]) -> str | None:
    """The first host compiler flag (`cuda_cpp`'s `cflags`) not on its allow-list; None: all allowed."""
    for flag, value in _pairs(flags):
        if not HOST_FLAGS.fullmatch(flag if value is None else _joined(flag, value)):
            return _refusal(flag if value is None else f"{flag} {value}", HOST_SUMMARY)
    return None


def refused_link(flags: Sequence[str]) -> str | None:
    """The first linker flag not naming one of the CUDA toolkit's libraries; None: all allowed."""
    bad = next((flag for flag in flags if not LINK_FLAGS.fullmatch(flag)), None)
    return None if bad is None else (f"option `{bad}` refused: only the CUDA toolkit's libraries may be "
                                     f"linked (-lcublas, -lcudart, ...)")


def without_ptxas(flags: Sequence[str]) -> list[str]:
    """`flags` less ptxas's options (`-Xptxas X`, `--ptxas-options=X`): the preprocessor's pass."""
    kept: list[str] = []
    for flag, value in _pairs(flags):
        if flag in ("-Xptxas", "--ptxas-options") or flag.startswith(("-Xptxas=", "--ptxas-options=")):
            continue
        kept.extend([flag] if value is None else [flag, value])
    return kept


def _pairs(flags: Sequence[str]) -> list[tuple[str, str | None]]:
    """(option, its separate value or None), in order; an option that needs a value and has none
    keeps value "" (refused)."""
    pairs, k = [], 0
    while k < len(flags):
        flag = flags[k]
        if flag in SEPARATE:
            pairs.append((flag, flags[k + 1] if k + 1 < len(flags) else ""))
            k += 2
        else:
            pairs.append((flag, None))
            k += 1
    return pairs


def _joined(flag: str, value: str) -> str:
    return f"{flag}{value}" if flag in ("-D", "-U", "-I") else f"{flag}={value}"


def _refusal(flag: str, allowed: str = ALLOWED_SUMMARY) -> str:
    return f"option `{flag}` refused: not on the evaluator's allow-list ({allowed})"

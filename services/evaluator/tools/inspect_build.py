"""The `inspect` tool: what the build of a `cuda` solution made, without running any of it.

The solution's `.cu` sources are compiled as an evaluation compiles them (`nvcc.build_cubin`'s
command, with `-Xptxas -v` added: the same cubin, ptxas's resource report beside it), into a folder
of the attempt's; nothing is loaded or launched. The text: per kernel its registers, spills, stack
frame, shared memory and barriers as ptxas reports them, then the SASS of the kernel asked for
(`cuobjdump -sass -fun`), its encoding words dropped and cut to `SASS_CHARS`. Needs nvcc, no GPU:
the CPU evaluator answers it too; without cuobjdump beside nvcc the SASS part says so. The build
and cuobjdump run as an evaluation's build does: options allow-listed, includes checked, every
program confined (`nvcc.compile_confined`, `isolation.run_confined`).
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from services.evaluator.languages.build import resolved_tunables
from services.evaluator.languages.flags import refused_build
from services.evaluator.languages.includes import read_output, toolkit_env
from services.evaluator.languages.nvcc import BUILD_TIMEOUT_S, CUBIN_FILE, compile_confined, define_flags, nvcc_flags
from services.evaluator.sandbox.isolation import run_confined
from services.evaluator.timer.plan import cubin_kernels
from shared.schema import Language, Solution, Status

SASS_CHARS = 3000
RESOURCE_CHARS = 1500
CUOBJDUMP_TIMEOUT_S = 60.0

_ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)'")
_PROPERTIES = re.compile(r"Function properties for (?P<name>\S+)")
_FIGURES = {
    "registers": re.compile(r"Used (\d+) registers"),
    "spill stores B": re.compile(r"(\d+) bytes spill stores"),
    "spill loads B": re.compile(r"(\d+) bytes spill loads"),
    "stack B": re.compile(r"(\d+) bytes stack frame"),
    "smem B": re.compile(r"(\d+) bytes smem"),
    "barriers": re.compile(r"used (\d+) barriers"),
    "cmem[0] B": re.compile(r"(\d+) bytes cmem\[0\]"),
}


@dataclass(frozen=True)
class Inspected:
    status: Status | None  # None: answered (INSPECTED); else the error's status, `text` its reason
    text: str


def inspect_solution(solution: Solution, arch: str, workdir: Path, kernel: str | None = None) -> Inspected:
    """Build `solution` in `workdir` and describe it; `kernel`: whose SASS to show (None: the
    first kernel's, by name, when there is only one; else the list of names)."""
    if solution.spec.language is not Language.CUDA:
        return Inspected(Status.UNSUPPORTED, f"inspect reads the build of a `cuda` solution; this one is "
                                             f"{solution.spec.language.value}")
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return Inspected(Status.UNSUPPORTED, "nvcc is not on PATH on this evaluator")
    built = _compile(solution, arch, workdir, nvcc)
    if isinstance(built, Inspected):
        return built
    cubin, ptxas = built
    data = read_output(cubin, workdir)
    if data is None:
        return Inspected(Status.COMPILE_ERROR, "nvcc made no cubin")
    names = sorted(cubin_kernels(data))
    parts = [f"build for {arch}: {len(names)} kernel{'s' if len(names) != 1 else ''}: {', '.join(names) or 'none'}",
             "ptxas -v:", resource_table(ptxas)]
    if kernel is None and len(names) == 1:
        kernel = names[0]
    if kernel is None:
        parts.append("SASS: name a kernel (one of: " + ", ".join(names) + ")")
    elif kernel not in names:
        parts.append(f"SASS: the cubin has no kernel `{kernel}`; its kernels: " + (", ".join(names) or "none"))
    else:
        parts.append(f"SASS of {kernel}:\n" + sass(cubin, kernel, nvcc))
    return Inspected(None, "\n".join(parts))


def _compile(solution: Solution, arch: str, workdir: Path, nvcc: str) -> tuple[Path, str] | Inspected:
    """The cubin (`nvcc.build_cubin`'s flags, allow-list, include check and confinement, plus
    `-Xptxas -v`) and ptxas's report."""
    if not any(s.path.endswith(".cu") for s in solution.sources):
        return Inspected(Status.COMPILE_ERROR, "a `cuda` solution needs at least one .cu source")
    tunables = resolved_tunables(solution)
    why = refused_build(solution, define_flags(tunables))
    if why:
        return Inspected(Status.COMPILE_ERROR, why)
    output: list[str] = []
    log = compile_confined(nvcc, solution, [*nvcc_flags(solution, arch, tunables), "-Xptxas", "-v"], workdir,
                           BUILD_TIMEOUT_S, output)
    if log is not None:
        return Inspected(Status.COMPILE_ERROR, log)
    return workdir / CUBIN_FILE, "".join(output)


def resource_table(ptxas: str) -> str:
    """ptxas's per-function report as one line a function: entries (kernels) first, then device
    functions that were not inlined (their stack and spills count too)."""
    functions: dict[str, dict[str, str]] = {}
    entries: list[str] = []
    current = None
    for line in ptxas.splitlines():
        entry = _ENTRY.search(line)
        if entry:
            current = entry["name"]
            entries.append(current)
            functions.setdefault(current, {})
            continue
        properties = _PROPERTIES.search(line)
        if properties:
            current = properties["name"]
            functions.setdefault(current, {})
            continue
        if current is None:
            continue
        for label, pattern in _FIGURES.items():
            found = pattern.search(line)
            if found:
                functions[current][label] = found.group(1)
    if not functions:
        return "(ptxas reported no function)"
    order = entries + sorted(set(functions) - set(entries))
    rows = [f"  {'kernel' if name in entries else 'device fn'} {name}: "
            + (", ".join(f"{label} {functions[name][label]}" for label in _FIGURES if label in functions[name])
               or "no figures")
            for name in order]
    return _cut("\n".join(rows), RESOURCE_CHARS)


def cuobjdump_path(nvcc: str) -> str | None:
    """cuobjdump beside nvcc (its real folder, through a wrapper script too), else on PATH."""
    for folder in (Path(nvcc).resolve().parent, Path("/usr/local/cuda/bin")):
        if (folder / "cuobjdump").is_file():
            return str(folder / "cuobjdump")
    return shutil.which("cuobjdump")


def sass(cubin: Path, kernel: str, nvcc: str) -> str:
    """`cuobjdump -sass -fun KERNEL`, each instruction on one line without its encoding, the
    padding after the last EXIT's branch dropped, cut to `SASS_CHARS`."""
    tool = cuobjdump_path(nvcc)
    if tool is None:
        return "(cuobjdump is not installed beside nvcc on this evaluator: no SASS; the ptxas figures above stand)"
    done = run_confined([tool, "-sass", "-fun", kernel, cubin.name], cubin.parent, CUOBJDUMP_TIMEOUT_S,
                        env=toolkit_env(nvcc))  # the cubin is the solution's: read confined
    if done.timed_out:
        return f"(cuobjdump ran past {CUOBJDUMP_TIMEOUT_S:.0f} s)"
    if done.exit_code != 0 or "/*0000*/" not in done.output:
        return f"(cuobjdump failed: {done.output.strip()[-500:]})"
    return _cut(trim_sass(done.output), SASS_CHARS)


_INSTRUCTION = re.compile(r"^\s*/\*(?P<at>[0-9a-f]{4,})\*/\s*(?P<text>.*?)\s*(/\*\s*0x[0-9a-f]+\s*\*/)?\s*$")


def trim_sass(listing: str) -> str:
    """One line per instruction (`/*0040*/ IMAD R7, R7, UR4, R0 ;`), the trailing `BRA` to itself
    and `NOP` padding dropped."""
    lines = []
    for line in listing.splitlines():
        match = _INSTRUCTION.match(line)
        if match and match["text"]:
            lines.append(f"/*{match['at']}*/ {match['text']}")
    while lines and (lines[-1].endswith("NOP ;") or lines[-1].endswith("NOP;")):
        lines.pop()
    if lines and re.search(r"BRA 0x([0-9a-f]+)\s*;$", lines[-1]):
        at = lines[-1].split("*/")[0].strip("/*")
        target = re.search(r"BRA 0x([0-9a-f]+)", lines[-1]).group(1)
        if int(at, 16) == int(target, 16):
            lines.pop()
    return "\n".join(lines)


def _cut(text: str, limit: int) -> str:
    """`text` within `limit` characters: its head and tail, what was left out counted between."""
    if len(text) <= limit:
        return text
    lines = text.splitlines()
    head, tail, used = [], [], 0
    for i in range(len(lines)):
        front, back = lines[i], lines[-1 - i]
        if used + len(front) + len(back) + 2 > limit - 60 or i >= len(lines) - 1 - i:
            break
        head.append(front)
        tail.insert(0, back)
        used += len(front) + len(back) + 2
    left = len(lines) - len(head) - len(tail)
    return "\n".join([*head, f"... {left} lines left out ...", *tail])

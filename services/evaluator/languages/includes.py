"""What a build may read and what its messages may show: the solution's own folder, the CUDA
toolkit and the host compiler's system headers (and, for `cuda_cpp`, torch's and Python's headers).

A macro can build an include path (`#include P(/etc,secret)`), so the sources are not read for
`#include` lines: the preprocessor runs first, confined like the build (`run_confined`), and writes
the list of files it opened (`-M`); any file outside those folders refuses the build with
COMPILE_ERROR naming it, its text never shown. The compiler's output reaches the site
(`compiler_excerpt`): a diagnostic located in a file outside those folders, or in one there that
others may not read, is replaced by one line naming the file; the toolkit's own headers, which
anyone may read, are shown as they are.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path

from services.evaluator.sandbox.isolation import run_confined

DEPS_FILE = "__kernelswarm_deps.d"
HOST_SYSTEM_HEADERS = ("/usr/include", "/usr/lib/gcc", "/usr/lib64/gcc", "/usr/local/include")
MAX_LOG_CHARS = 3000
_GCC_AT = re.compile(r"^(?P<path>[^\s:(][^:(]*):(?P<line>\d+)(:\d+)?:\s")
_EDG_AT = re.compile(r'^"?(?P<path>[^\s"(][^"(]*)"?\((?P<line>\d+)\):\s')
_SUMMARY = re.compile(r"^(\d+ errors? detected|Error limit reached|compilation terminated|ptxas|nvcc|ninja|"
                      r"In file included from|\s+from )")
_ERROR_LINE = re.compile(r"(error|fatal|ptxas)", re.IGNORECASE)


def toolkit_root(nvcc: str) -> Path:
    """The CUDA toolkit nvcc belongs to: CUDA_HOME where set, else the folder above nvcc's own
    (through a wrapper script: /usr/local/cuda)."""
    for candidate in (os.environ.get("CUDA_HOME"), Path(nvcc).resolve().parent.parent, "/usr/local/cuda"):
        if candidate and (Path(candidate) / "bin" / "nvcc").is_file() and (
                (Path(candidate) / "include" / "cuda_runtime.h").is_file() or (Path(candidate) / "targets").is_dir()):
            return Path(candidate).resolve()
    return Path(nvcc).resolve().parent  # no toolkit found: its own folder only


def toolkit_env(nvcc: str) -> dict[str, str]:
    """What a confined build needs beyond `scrubbed_env`: the toolkit's folder first on PATH, CUDA_HOME."""
    root = toolkit_root(nvcc)
    return {"PATH": f"{root / 'bin'}:{Path(nvcc).parent}:/usr/local/bin:/usr/bin:/bin", "CUDA_HOME": str(root)}


def readable_roots(nvcc: str, extra: Sequence[Path] = ()) -> tuple[str, ...]:
    """The folders (real paths) besides the solution's whose files a build may open and show."""
    roots = [toolkit_root(nvcc), *HOST_SYSTEM_HEADERS, *extra]
    return tuple(dict.fromkeys(os.path.realpath(r) for r in roots))


def read_output(path: Path, workdir: Path) -> bytes | None:
    """A file a confined build made in `workdir` (its cubin, its extension, its list of includes),
    read by the evaluator: None where it is not a regular file inside `workdir` (a link a build
    left there to a file of the evaluator's is never followed)."""
    if not os.path.realpath(path).startswith(os.path.realpath(workdir) + os.sep):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        return handle.read() if stat.S_ISREG(os.fstat(fd).st_mode) else None


def outside_files(deps: str, workdir: Path, roots: Sequence[str]) -> list[str]:
    """The files a `-M` list (make's syntax) names that lie outside `workdir` and `roots`, or
    inside a root but not readable by others."""
    names = [n.replace("\\ ", " ") for n in re.split(r"(?<!\\)\s+", deps.replace("\\\n", " ")) if n and n != "\\"]
    files = [n for n in names if not n.endswith(":")]
    return [f for f in files if _where(f, workdir, roots) == "outside"]


def check_includes(command: Sequence[str], unit: str, workdir: Path, timeout_s: float, roots: Sequence[str],
                   env: dict[str, str]) -> str | None:
    """The preprocessor's pass over `unit` (`command`: a compiler and its flags; `-M`, confined, in
    `workdir`): None where every file it opened is the solution's or below `roots` (the toolkit,
    the system headers); else the COMPILE_ERROR's message."""
    (workdir / DEPS_FILE).unlink(missing_ok=True)
    done = run_confined([command[0], "-M", *command[1:], "-o", DEPS_FILE, unit], workdir, timeout_s, env=env)
    if done.timed_out:
        return f"the preprocessor ran past {timeout_s:.0f} s and was stopped"
    deps = (read_output(workdir / DEPS_FILE, workdir) or b"").decode(errors="replace")
    outside = outside_files(deps, workdir, roots)
    if outside:
        return ("the build opened files outside the solution's folder, the CUDA toolkit and the system headers "
                f"(refused; their text is not shown): {', '.join(outside[:5])}")
    if done.exit_code != 0:
        return compiler_excerpt(done.output, workdir, roots)
    return None


def compiler_excerpt(output: str, workdir: Path, roots: Sequence[str] | None = None) -> str:
    """The error lines with the two after each (the compiler prints the offending code there),
    paths made relative, a diagnostic in a file the solution may not show reduced to one line naming
    it (`shown`); capped so that an agent's context is not flooded."""
    lines = shown(output, workdir, readable_roots(shutil.which("nvcc") or "nvcc") if roots is None else roots)
    lines = [line.replace(f"{workdir}/", "") for line in lines]
    keep = sorted({j for i, line in enumerate(lines) if _ERROR_LINE.search(line)
                   for j in range(i, min(i + 3, len(lines)))})
    text = "\n".join(lines[j] for j in keep) or "\n".join(lines[-30:])
    return text if len(text) <= MAX_LOG_CHARS else text[:MAX_LOG_CHARS] + "\n... (truncated)"


def shown(output: str, workdir: Path, roots: Sequence[str]) -> list[str]:
    """The compiler's lines, but those of a diagnostic located in a file outside `workdir` and
    `roots` (or not readable by others): its first line becomes a notice naming the file, and
    every line after it is left out up to the next diagnostic's location or the compiler's summary."""
    out: list[str] = []
    hiding = False
    for line in output.splitlines():
        at = _GCC_AT.match(line) or _EDG_AT.match(line)
        if at is not None:
            path = at["path"].strip()
            hiding = _where(path, workdir, roots) == "outside"
            if hiding:
                out.append(f"{path}({at['line']}): error in a file outside the solution's folder "
                           f"(its text is not shown)")
                continue
        elif hiding and not _SUMMARY.match(line):
            continue
        else:
            hiding = False
        out.append(line)
    return out


def _where(path: str, workdir: Path, roots: Sequence[str]) -> str:
    """"own" (the solution's folder), "shown" (a root's file that others may read), or "outside"."""
    real = os.path.realpath(os.path.join(workdir, path))
    own = os.path.realpath(workdir)
    if real == own or real.startswith(own + os.sep):
        return "own"
    if any(real.startswith(root.rstrip(os.sep) + os.sep) for root in roots):
        try:
            return "shown" if os.stat(real).st_mode & 0o004 else "outside"
        except OSError:
            return "outside"
    return "outside"

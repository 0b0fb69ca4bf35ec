"""Issue 40, row C2: a solution's text drives nvcc (every `cuda` build, the `inspect` tool), so its
compile options and includes are attacks on the evaluator's machine. Each attack beside an honest
control through the same stage: the allow-listed options still build, an error in the solution's own
file still shows its line. nvcc is on CI's machine; `-cubin` builds need no GPU."""

from __future__ import annotations

import secrets
import shutil
import tempfile
from pathlib import Path

import pytest

from services.evaluator.languages import nvcc
from services.evaluator.tools.inspect_build import inspect_solution
from shared.schema import Language, Solution, Status
from shared.schema.solution import CompileOptions

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")

REPO = Path(__file__).resolve().parents[2]
SECRET = "TOPSECRET_c2_" + secrets.token_hex(4)
KERNEL = r"""
extern "C" __global__ void scale(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = FOO * x[i];
}
"""
HONEST_FLAGS = ["-O3", "-maxrregcount=64", "-DFOO=1", "--use_fast_math", "-Xptxas", "-v"]


def solution(cu: str = KERNEL, flags: list[str] | None = None, extra: list[dict] | None = None,
             tunables: dict | None = None) -> Solution:
    spec = {"languages": ["cuda"], "target_hardware": ["H100"], "entry_point": "launch.py::run",
            "compile_options": {"cuda_cflags": flags if flags is not None else ["-DFOO=2"]}}
    if tunables:
        spec["tunables"] = tunables
    return Solution.model_validate({
        "name": "c2", "definition": "c2", "author": "attacker", "spec": spec,
        "sources": [{"path": "k.cu", "content": cu},
                    {"path": "launch.py", "content": "def run(x, y, *, kernels):\n    pass\n"}, *(extra or [])]})


@pytest.fixture
def outside(tmp_path):
    """Two folders outside any build: one in /tmp (a scratch mount: a confined build sees an
    empty one of its own there) and one in the package's tree (a read-only mount to it)."""
    in_repo = Path(tempfile.mkdtemp(prefix=".c2-", dir=Path(__file__).parent))
    try:
        yield [tmp_path / "out", in_repo]
    finally:
        shutil.rmtree(in_repo, ignore_errors=True)


def specs_attack(markers: list[Path]) -> Solution:
    """`-Xcompiler -specs=evil.specs`: the spec file among the sources wraps every program gcc runs
    in a script of the solution's, which writes `markers` and, in its own folder, `ran-here`."""
    script = "#!/bin/sh\n" + "".join(f"mkdir -p {m.parent}; echo pwned > {m}\n" for m in markers)
    script += "echo ran > ran-here\nexec \"$@\"\n"
    return solution(flags=["-DFOO=2", "-Xcompiler", "-specs=evil.specs"], extra=[
        {"path": "evil.specs", "content": "*self_spec:\n+ -wrapper /bin/sh,evil.sh\n"},
        {"path": "evil.sh", "content": script}])


def test_specs_option_is_refused_by_name_before_anything_runs(tmp_path, outside):
    markers = [folder / "marker" for folder in outside]
    built = nvcc.build_cubin(specs_attack(markers), "sm_90a", {}, tmp_path / "b")
    assert not any(m.exists() for m in markers)
    assert not (tmp_path / "b" / "ran-here").exists()  # nothing ran at all
    assert not built.ok and "-Xcompiler" in built.log


def test_without_the_allow_list_the_confinement_alone_keeps_the_build_in_its_folder(tmp_path, outside, monkeypatch):
    monkeypatch.setattr(nvcc, "refused_build", lambda *_args: None, raising=False)
    markers = [folder / "marker" for folder in outside]
    built = nvcc.build_cubin(specs_attack(markers), "sm_90a", {}, tmp_path / "b")
    assert (tmp_path / "b" / "ran-here").exists(), built.log  # control: the script did run, in its folder
    assert not any(m.exists() for m in markers), built.log


def test_honest_allowed_options_build(tmp_path):
    built = nvcc.build_cubin(solution(flags=HONEST_FLAGS), "sm_90a", {}, tmp_path / "b")
    assert built.ok, built.log
    assert built.cubin[:4] == b"\x7fELF"


def secret_file(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "secret.h"
    path.write_text(f"{SECRET} leaked;\nint {SECRET}_too = {SECRET};\n")
    path.chmod(0o600)
    return path


def absolute_include(secret: Path) -> str:
    return f'#include "{secret}"\n' + KERNEL


def macro_include(secret: Path) -> str:
    """The path made by the preprocessor from pieces: no `#include "/..."` in the text."""
    return ("#define KS_STR(x) #x\n#define KS_PATH(a, b) KS_STR(a/b)\n"
            f"#include KS_PATH({secret.parent}, secret.h)\n" + KERNEL)


@pytest.mark.parametrize("make", [absolute_include, macro_include])
def test_include_of_a_file_outside_the_solution_is_refused_without_its_text(tmp_path, outside, make):
    for folder in outside:
        secret = secret_file(folder / "s")
        built = nvcc.build_cubin(solution(make(secret)), "sm_90a", {}, tmp_path / f"b-{folder.name}")
        assert not built.ok
        assert SECRET not in built.log and "secret.h" in built.log, built.log


def test_an_error_in_the_solutions_own_header_still_shows_its_line(tmp_path):
    cu = '#include "own.cuh"\n' + KERNEL
    built = nvcc.build_cubin(solution(cu, extra=[{"path": "own.cuh", "content": "int own = undefined_q;\n"}]),
                             "sm_90a", {}, tmp_path / "b")
    assert not built.ok and "undefined_q" in built.log and "own.cuh" in built.log


def test_tunable_value_cannot_reach_nvccs_shell(tmp_path, outside):
    marker = outside[1] / "tunable-marker"
    attack = solution(tunables={"FOO": [f"$(touch {marker})"]}, flags=[])
    built = nvcc.build_cubin(attack, "sm_90a", {"FOO": f"$(touch {marker})"}, tmp_path / "b")
    assert not marker.exists()
    assert not built.ok and "tunable" in built.log
    honest = nvcc.build_cubin(solution(tunables={"FOO": [2]}, flags=[]), "sm_90a", {"FOO": 2}, tmp_path / "c")
    assert honest.ok, honest.log


def test_inspect_tool_refuses_the_same_attacks(tmp_path, outside):
    markers = [folder / "marker" for folder in outside]
    found = inspect_solution(specs_attack(markers), "sm_90a", tmp_path / "i1")
    assert not any(m.exists() for m in markers)
    assert found.status is Status.COMPILE_ERROR and "-Xcompiler" in found.text
    secret = secret_file(outside[1] / "s")
    found = inspect_solution(solution(macro_include(secret)), "sm_90a", tmp_path / "i2")
    assert found.status is Status.COMPILE_ERROR and SECRET not in found.text and "secret.h" in found.text
    honest = inspect_solution(solution(flags=HONEST_FLAGS), "sm_90a", tmp_path / "i3")
    assert honest.status is None and "kernel scale:" in honest.text, honest.text


def test_messages_hide_diagnostics_located_outside_but_show_the_toolkits(tmp_path):
    from services.evaluator.languages import includes  # imported here: each test fails alone on the base commit

    roots = includes.readable_roots(shutil.which("nvcc"))
    root = includes.toolkit_root(shutil.which("nvcc"))
    header = next(root.glob("**/include/cuda_runtime.h"))
    output = (f"/etc/ks-secret.h(1): error: identifier \"{SECRET}\" is undefined\n  {SECRET} leaked;\n  ^\n\n"
              f"{tmp_path}/b/k.cu(3): error: identifier \"mine\" is undefined\n  int x = mine;\n"
              f"{header}(10): error: something in the toolkit\n  toolkit_line;\n"
              f"/etc/ks-secret.h:2:5: error: expected ';'\n    2 | {SECRET}\n      |  ^\n")
    text = includes.compiler_excerpt(output, tmp_path / "b", roots)
    assert SECRET not in text and "/etc/ks-secret.h(1)" in text
    assert "k.cu(3)" in text and "int x = mine;" in text and "toolkit_line;" in text


@pytest.mark.parametrize("flags, named", [
    (["-Xcompiler", "-specs=evil.specs"], "-Xcompiler"), (["-ccbin", "/tmp/gcc"], "-ccbin"),
    (["--compiler-bindir=/tmp"], "--compiler-bindir"), (["-include", "/etc/shadow"], "-include"),
    (["-I/etc"], "-I/etc"), (["-I", "../.."], "../.."), (["-Iinc/../../x"], "-Iinc/../../x"), (["-L/tmp"], "-L/tmp"),
    (["-o", "/tmp/x"], "-o"), (["--keep-dir", "/tmp"], "--keep-dir"), (["-Xlinker", "-x"], "-Xlinker"),
    (["@flags.rsp"], "@flags.rsp"), (["-arch=sm_50"], "architecture"),
    (["-gencode", "arch=compute_50"], "architecture"),
    (["-Xptxas", "-v,--fake"], "--fake"), (["-DX=$(id)"], "-DX=$(id)"), (["-Xptxas"], "-Xptxas")])
def test_options_off_the_allow_list_are_refused_by_name(flags, named):
    from services.evaluator.languages import flags as flags_module

    why = flags_module.refused_nvcc(flags)
    assert why is not None and named in why


def test_allowed_options_and_host_lists():
    from services.evaluator.languages import flags as flags_module

    allowed = [*HONEST_FLAGS, "-lineinfo", "-D", "BAR=3", "-UBAZ", "-std=c++20", "--expt-relaxed-constexpr",
               "--expt-extended-lambda", "-Iinclude", "-I", "inc/sub", "-ftz=true", "-prec-div=false",
               "-prec-sqrt=false", "-fmad=true", "--maxrregcount", "128", "-Xptxas=-O3,--warn-on-spills"]
    assert flags_module.refused_nvcc(allowed) is None
    options = CompileOptions(cflags=["-O3", "-std=c++17"], cuda_cflags=["-O3"], ld_flags=["-lcublas"])
    assert flags_module.refused_options(options, Language.CUDA_CPP) is None
    bad = CompileOptions(cflags=["-fplugin=./x.so"], ld_flags=["-lcublas"])
    assert "-fplugin" in flags_module.refused_options(bad, Language.CUDA_CPP)
    assert "-Wl,-rpath" in flags_module.refused_options(CompileOptions(ld_flags=["-Wl,-rpath,/tmp"]), Language.CUDA_CPP)


PYBIND = ('#include <pybind11/pybind11.h>\nint twice(int x) { return 2 * x; }\n'
          'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("twice", &twice); }\n')


def extension(cpp: str, cflags: list[str] | None = None) -> Solution:
    return Solution.model_validate({
        "name": "c2x", "definition": "c2x", "author": "attacker",
        "spec": {"languages": ["cuda_cpp"], "target_hardware": ["H100"], "entry_point": "k.cpp::twice",
                 "compile_options": {"cflags": cflags or ["-O3"]}},
        "sources": [{"path": "k.cpp", "content": cpp}]})


def test_cuda_cpp_build_refuses_a_host_flag_and_an_outside_include(tmp_path, outside):
    """The torch extension's build (a minute to build honestly: its honest control here is the
    same include check passing on torch's and pybind11's headers)."""
    from services.evaluator.languages import torchext

    refused = torchext.build_extension(extension(PYBIND, ["-fplugin=./evil.so"]), "sm_90a", {}, tmp_path / "a")
    assert not refused.ok and "-fplugin=./evil.so" in refused.log
    secret = secret_file(outside[1] / "s")
    leaked = torchext.build_extension(extension(f'#include "{secret}"\n' + PYBIND), "sm_90a", {}, tmp_path / "b")
    assert not leaked.ok and SECRET not in leaked.log and "secret.h" in leaked.log, leaked.log
    nvcc_path = shutil.which("nvcc")
    job = {"name": "ks_ext_honest", "sources": [str(tmp_path / "c" / "k.cpp")], "cflags": ["-O3"], "cuda_cflags": []}
    nvcc.write_sources(extension(PYBIND), tmp_path / "c")
    roots = torchext.readable_roots(nvcc_path, torchext.header_folders())
    assert torchext.opened_outside(nvcc_path, job, ["k.cpp"], tmp_path / "c", 120.0, roots, "sm_90a") is None


def test_a_link_a_build_leaves_is_never_read_as_its_output(tmp_path):
    from services.evaluator.languages.includes import read_output

    build = tmp_path / "b"
    build.mkdir()
    secret = secret_file(tmp_path / "s")
    (build / "kernels.cubin").symlink_to(secret)
    assert read_output(build / "kernels.cubin", build) is None
    (build / "real.cubin").write_bytes(b"\x7fELF")  # control: a file it made is read
    assert read_output(build / "real.cubin", build) == b"\x7fELF"


PROBE = r"""
import os, socket, sys, time
outside, port, parent = sys.argv[1], int(sys.argv[2]), sys.argv[3]
print("env:" + os.environ.get("KS_C2_SECRET", "none"))
for path in (os.path.join(outside, "written"), "own"):
    try:
        open(path, "w").write("x")
        print("wrote " + path)
    except OSError as error:
        print("refused " + path + " " + error.strerror)
try:
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    print("connected")
except OSError:
    print("no network")
try:
    open(f"/proc/{parent}/environ", "rb").read()
    print("read the evaluator's environ")
except OSError:
    print("the evaluator's environ refused")
sys.stdout.flush()
if len(sys.argv) > 4:
    import fcntl
    if os.fork() == 0:  # its pid is its PID namespace's: the lock it holds says it lives
        os.setsid()  # a daemon of its own session
        fcntl.flock(os.open("daemon.lock", os.O_RDWR | os.O_CREAT, 0o666), fcntl.LOCK_EX)
        open("daemon.locked", "w").write("x")
        time.sleep(300)
    time.sleep(300)
"""


def test_run_confined_gives_a_program_a_candidates_confinement(tmp_path, outside, monkeypatch):
    """The entry every build and tool program runs through: own folder writable only, no network,
    the evaluator's environment not passed on and its /proc/<pid>/environ out of reach (nobody, or
    uid 0 without capabilities), and at its timeout everything it started gone, a daemon of its own
    session too. The control: the same probe run plainly connects, writes outside, reads it."""
    import os
    import socket
    import subprocess
    import sys
    import time

    from services.evaluator.sandbox.isolation import run_confined

    if os.geteuid() != 0:
        pytest.skip("the evaluator confines its builds this far only as root (CI runs as root)")
    monkeypatch.setenv("KS_C2_SECRET", SECRET)
    work = tmp_path / "w"
    work.mkdir()
    (work / "probe.py").write_text(PROBE)
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = str(server.getsockname()[1])
        args = [sys.executable, "probe.py", str(outside[1]), port, str(os.getpid())]
        plain = subprocess.run(args, cwd=work, capture_output=True, text=True, timeout=60).stdout
        assert "connected" in plain and f"wrote {outside[1]}" in plain and "read the evaluator's environ" in plain
        (outside[1] / "written").unlink()
        done = run_confined(args, work, 60)
    assert done.exit_code == 0 and "wrote own" in done.output, done.output
    assert SECRET not in done.output and "no network" in done.output and "evaluator's environ refused" in done.output
    assert not (outside[1] / "written").exists()
    stopped = run_confined([*args, "daemon"], work, 3)
    assert stopped.timed_out
    assert (work / "daemon.locked").exists(), stopped.output  # control: the daemon did start
    time.sleep(0.2)
    from tests.evaluator.evalkit import lock_is_free

    assert lock_is_free(work / "daemon.lock"), "the daemon outlived its build"

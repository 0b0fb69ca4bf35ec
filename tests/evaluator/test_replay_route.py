"""A `cuda` attempt's route through record and replay, on the CPU (evaluate.py, timer/route.py):
the candidate's child records the launch plans, the evaluator judges them, and a third child
times them. Nothing here can launch a kernel (no GPU, no pycuda), so every attempt ends in the
timer child's RUNTIME_ERROR; what the test reads is the route taken: which child imported the
solution's launch.py (a file it writes in `drop` at import), and what the writer is told.
The build is the real one but for nvcc: the cubin is a minimal ELF file with the kernel's symbol."""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

import pytest

from evalkit import FAST
from services.evaluator import evaluate as evaluate_module
from services.evaluator.languages.build import Build, resolved_tunables
from services.evaluator.languages.nvcc import CUBIN_FILE
from services.evaluator.evaluate import evaluate
from services.evaluator.timer.plan import cubin_kernels
from shared.schema import Solution, Status

CONFIG = dataclasses.replace(FAST, fork_server=False)

MARK = """
import json, os
from pathlib import Path
_job = json.loads(Path("job.json").read_text())
_where = "record" if _job.get("mode") == "record" else "replay" if _job.get("replay") else "in_process"
Path(DROP, f"{_where}-{os.getpid()}").touch()
"""

HONEST = MARK + """
def run(x, w, b, y, *, kernels):
    kernels.affine(x, w, b, y, x.shape[0], grid=(x.shape[0],), block=(16,))
"""

# Passes a value of the input set as a kernel's scalar: each set gives another plan.
READS_VALUES = MARK + """
def run(x, w, b, y, *, kernels):
    kernels.affine(x, w, b, y, float(x.numpy()[0, 0]), grid=(x.shape[0],), block=(16,))
"""

# Writes the record step's result itself: no plan at all where a plan is expected.
FORGES_THE_RECORD = MARK + """
if _job.get("mode") == "record":
    results = [{"uuid": w["uuid"], "status": "OK", "plans": [{"steps": [{"op": "exec"}]}] * 2}
               for w in _job["workloads"]]
    Path(_job["result_path"]).write_text(json.dumps({"workloads": results}))
    os._exit(0)

def run(x, w, b, y, *, kernels):
    pass
"""


def elf_with_kernels(*names: str) -> bytes:
    """The least of a cubin `cubin_kernels` reads: a symbol table of global CUDA entry functions."""
    strings = b"\0" + b"".join(n.encode() + b"\0" for n in names)
    symbols = b"\0" * 24
    at = 1
    for name in names:
        symbols += struct.pack("<IBBHQQ", at, 0x12, 0x10, 0, 0, 0)  # GLOBAL FUNC, STO_CUDA_ENTRY
        at += len(name) + 1
    header_size = 64
    section_at = header_size + len(strings) + len(symbols)
    header = b"\x7fELF\x02\x01\x01" + b"\0" * 9 + struct.pack("<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, section_at, 0,
                                                                    64, 0, 0, 64, 3, 0)
    sections = b"\0" * 64
    sections += struct.pack("<IIQQQQIIQQ", 0, 3, 0, 0, header_size, len(strings), 0, 0, 1, 0)
    sections += struct.pack("<IIQQQQIIQQ", 0, 2, 0, 0, header_size + len(strings), len(symbols), 1, 1, 8, 24)
    return header + strings + symbols + sections


def test_the_minimal_elf_reads_as_its_kernels():
    assert cubin_kernels(elf_with_kernels("affine", "other")) == {"affine", "other"}


@pytest.fixture
def built(monkeypatch):
    """The build of a `cuda` solution on this CPU machine: its sources written, the cubin faked."""
    def build(solution: Solution, device, target: Path, arch=None, cache=None) -> Build:
        target.mkdir(parents=True, exist_ok=True)
        for source in solution.sources:
            (target / source.path).write_text(source.content)
        (target / CUBIN_FILE).write_bytes(elf_with_kernels("affine"))
        return Build(None, "", target, resolved_tunables(solution), target / CUBIN_FILE)  # artifact_path

    monkeypatch.setattr(evaluate_module, "build_solution", build)


def cuda(launch: str, drop: Path) -> Solution:
    return Solution.model_validate({
        "name": "affine_cuda", "definition": "affine_float32", "author": "test",
        "spec": {"languages": ["cuda"], "target_hardware": ["H200"], "entry_point": "launch.py::run"},
        "sources": [{"path": "launch.py", "content": launch.replace("DROP", repr(str(drop)))},
                    {"path": "affine.cu", "content": "// built elsewhere\n"}]})


def imported(drop: Path) -> list[str]:
    return sorted(p.name.split("-")[0] for p in drop.iterdir())


def test_a_plan_that_repeats_is_replayed_by_a_child_that_never_imports_the_solution(affine, drop, built):
    result = evaluate(affine, cuda(HONEST, drop), CONFIG)
    assert imported(drop) == ["record"]  # the record child, once for both workloads; not the timer
    assert "record" in result.child_phases
    assert result.status is Status.RUNTIME_ERROR  # no kernel can launch here
    assert all("timer/replay.py" in t.evaluation.log and "not replayed" not in t.evaluation.log
               for t in result.traces), result.message


def test_a_plan_that_depends_on_the_values_is_timed_in_process_and_the_writer_told_why(affine, drop, built):
    result = evaluate(affine, cuda(READS_VALUES, drop), CONFIG)
    assert imported(drop) == ["in_process", "record"]
    assert result.status is Status.RUNTIME_ERROR
    for trace in result.traces:
        assert trace.evaluation.log.startswith("not replayed, timed in the solution's own process: workload "
                                               "affine-n3: its launches depend on the input values"), trace
        assert "step 0: affine(" in trace.evaluation.log
    # The writer's feedback says it once, whole, whatever each workload's own error
    from services.worker.feedback import feedback_text

    note = feedback_text(result.status.value, result.message, result.traces).splitlines()[1]
    assert note.startswith("note: not replayed, timed in the solution's own process: workload affine-n3"), note


def test_a_forged_record_is_a_reward_hack_and_nothing_is_timed(affine, drop, built):
    result = evaluate(affine, cuda(FORGES_THE_RECORD, drop), CONFIG)
    assert imported(drop) == ["record"]
    assert result.status is Status.REWARD_HACK
    assert all("not a recording of the call" in t.evaluation.log for t in result.traces), result.message


def test_replay_off_times_in_process_without_a_record(affine, drop, built):
    result = evaluate(affine, cuda(HONEST, drop), dataclasses.replace(CONFIG, replay=False))
    assert imported(drop) == ["in_process"]
    assert "record" not in result.child_phases and result.status is Status.RUNTIME_ERROR

"""shared.sol_bounded: counting in a child with a memory and a time limit. A reference that needs
more memory than the limit, one that loops, one that ignores the soft alarm and one that kills its
own process each get T_sol "unknown" with the reason, the workloads beside them are still counted,
and this process is untouched."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from kernelswarm.cli import main
from services.evaluator.sandbox.counting import SandboxRunner
from shared.schema import Workload
from shared.sol_bounded import (CountLimits, SolUnknownError, UnknownReason, count_bounded, count_workloads,
                                 work_to_json)
from shared.sol_count import count_work
from tests.shared.test_sol import GEMM, RMSNORM, define, random_workload

# Needs values (`.item()`), so it runs on the CPU, then asks for 8 GiB at once: over any limit here.
HOG = define({"n": None}, {"x": (["n"], "float32")}, {"y": (["n"], "float32")},
             "import torch\n\ndef run(x):\n    scale = x.abs().max().item()\n"
             "    big = torch.ones(1 << 31)\n    return x * scale + big[: x.shape[0]]\n")
LOOP = define({"n": None}, {"x": (["n"], "float32")}, {"y": (["n"], "float32")},
              "def run(x):\n    while True:\n        pass\n")
DEAF = define({"n": None}, {"x": (["n"], "float32")}, {"y": (["n"], "float32")},
              "import signal\n\ndef run(x):\n    signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
              "    while True:\n        pass\n")
# Kills its own process on the workload with n == 2 only.
SUICIDE = define({"n": None}, {"x": (["n"], "float32")}, {"y": (["n"], "float32")},
                 "import os\n\ndef run(x):\n    if x.shape[0] == 2:\n        os._exit(3)\n    return x * 2\n")
SMALL = CountLimits(memory_mb=2048, time_s=3.0, grace_s=2.0)
RUNNER = SandboxRunner()


def test_the_child_counts_what_count_work_counts_here():
    workloads = [random_workload(GEMM, M=256), random_workload(GEMM, M=1 << 22)]  # A alone 8 GiB: meta
    counted = count_workloads(GEMM, workloads, runner=RUNNER, limits=SMALL)
    assert [c.work for c in counted] == [count_work(GEMM, w) for w in workloads]
    assert all(c.reason is None and c.peak_mb and c.peak_mb < SMALL.memory_mb for c in counted)
    rmsnorm = random_workload(RMSNORM, T=64)
    assert count_bounded(RMSNORM, rmsnorm, runner=RUNNER) == count_work(RMSNORM, rmsnorm)


def test_a_reference_over_the_memory_limit_is_unknown_for_memory_and_this_process_survives():
    workloads = [random_workload(HOG, n=16), random_workload(HOG, n=32)]
    counted = count_workloads(HOG, workloads, runner=RUNNER, limits=SMALL)
    assert [c.reason for c in counted] == [UnknownReason.MEMORY, UnknownReason.MEMORY]
    assert all(c.work is None and "memory limit of 2048 MiB" in c.message for c in counted)
    with pytest.raises(SolUnknownError, match="memory limit") as raised:
        count_bounded(HOG, random_workload(HOG, n=16), runner=RUNNER, limits=SMALL)
    assert raised.value.reason is UnknownReason.MEMORY


@pytest.mark.parametrize("definition", [LOOP, DEAF], ids=["loop", "ignores-the-alarm"])
def test_a_reference_that_loops_forever_is_unknown_for_time(definition):
    [counted] = count_workloads(definition, [random_workload(definition, n=4)], runner=RUNNER, limits=SMALL)
    assert counted.reason is UnknownReason.TIME and counted.work is None
    assert "time limit of 3 s" in counted.message


def test_a_child_that_dies_loses_only_its_workload():
    workloads = [random_workload(SUICIDE, n=n) for n in (1, 2, 3)]
    counted = count_workloads(SUICIDE, workloads, runner=RUNNER, limits=SMALL)
    assert [c.work is not None for c in counted] == [True, False, True]
    assert counted[1].reason is UnknownReason.CRASH and "exited with 3" in counted[1].message
    assert counted[2].work == count_work(SUICIDE, workloads[2])


def test_a_missing_data_file_is_unknown_for_count(tmp_path: Path):
    workload = Workload.model_validate({"uuid": "w", "axes": {"M": 8}, "inputs": {
        "A": {"type": "safetensors", "path": "blob/a.safetensors", "tensor_key": "A"}, "B": {"type": "random"}}})
    [counted] = count_workloads(GEMM, [workload], tmp_path, runner=RUNNER, limits=SMALL)
    assert counted.reason is UnknownReason.COUNT and "blob/a.safetensors" in counted.message


def write_problem(folder: Path, definition, workloads) -> Path:
    folder.mkdir()
    (folder / "definition.json").write_text(definition.model_dump_json(exclude_unset=True))
    (folder / "workload.jsonl").write_text("".join(w.model_dump_json() + "\n" for w in workloads))
    return folder


def test_kernelswarm_sol_shows_unknown_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    hog = HOG.model_copy(update={"name": "hog"})
    folder = write_problem(tmp_path / "hog", hog, [random_workload(hog, n=16).model_copy(update={"uuid": "w1"})])
    assert main(["sol", str(folder), "--memory-mb", "2048", "--time-s", "20"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "T_sol unknown (memory): the count needed more than the memory limit of 2048 MiB" in out[2]
    assert out[-1] == "0 of 1 workloads counted"
    assert main(["sol", str(folder), "--memory-mb", "2048", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["t_sol_ms"] is None and row["unknown"] == "memory" and "2048 MiB" in row["error"]


def test_the_child_sees_none_of_this_processs_settings_or_keys(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("KERNELSWARM_DATABASE_URL", "postgresql://user:pw@db/ks")
    spy = define({"n": None}, {"x": (["n"], "float32")}, {"y": (["n"], "float32")},
                 "import os\n\ndef run(x):\n    leaked = [k for k in os.environ if 'OPENAI' in k or 'DATABASE' in k]\n"
                 "    assert not leaked, leaked\n    return x * 2\n")
    [counted] = count_workloads(spy, [random_workload(spy, n=4)], runner=RUNNER, limits=SMALL)
    assert counted.work is not None, counted.message


class HeldOpenChild:
    """A counting child that wrote `lines` and exited, while something it left behind (the test's
    end of the socket pair, a daemon's stand-in) holds its channel open."""

    def __init__(self, lines: list[bytes]) -> None:
        self._ours, self.theirs = socket.socketpair()
        self.theirs.sendall(b"".join(lines))
        self.results_fd = self._ours.fileno()
        self.stopped_with: float | None = None

    def exit_code(self) -> int | None:
        return 0

    def stop(self, wait_s: float) -> int | None:
        self.stopped_with = wait_s
        self._ours.close()
        self.theirs.close()
        return 0

    def log_tail(self) -> str:
        return ""


class FakeRunner:
    def __init__(self, *lines: bytes) -> None:
        self.lines, self.started = list(lines), []

    def start(self, request, problem_roots, memory_mb):
        self.started.append(HeldOpenChild(self.lines))
        return self.started[-1]


def test_a_child_that_exited_is_not_waited_for_while_its_channel_stays_open():
    work = json.dumps({"work": work_to_json(count_work(GEMM, random_workload(GEMM, M=8)))}).encode()
    runner = FakeRunner(b'{"ready": true}\n', work + b"\n")
    counted = count_workloads(GEMM, [random_workload(GEMM, M=8), random_workload(GEMM, M=16)], runner=runner,
                              limits=CountLimits(time_s=3600.0))  # would be an hour's wait for the channel's end
    assert counted[0].work == count_work(GEMM, random_workload(GEMM, M=8))
    assert counted[1].reason is UnknownReason.CRASH and "exited with 0" in counted[1].message
    assert [child.stopped_with for child in runner.started] == [CountLimits().grace_s]  # its exit code, then the kill


def test_a_line_that_is_not_a_result_loses_only_its_workload():
    runner = FakeRunner(b'{"ready": true}\n', b'{"work": "forged"}\n')
    [counted] = count_workloads(GEMM, [random_workload(GEMM, M=8)], runner=runner)
    assert counted.reason is UnknownReason.CRASH and "not a result" in counted.message


def test_there_is_no_count_without_a_runner():
    with pytest.raises(TypeError, match="runner"):
        count_workloads(GEMM, [random_workload(GEMM, M=8)])  # type: ignore[call-arg]


def test_shared_imports_no_service():
    """shared/ holds what services share (DESIGN.md, Layout): its counting takes the sandbox as a
    `CountRunner` instead of importing it."""
    import ast

    root = Path(__file__).resolve().parents[2]
    found = []
    for path in sorted((root / "shared").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.relative_to(root)}: {n}" for n in names if n.split(".")[0] in ("services", "kernelswarm")]
    assert found == []

"""Helpers of tests/attacks/test_sol_counting.py: problems whose reference attacks the process that
counts its work (at import, as `load_reference` runs it), their honest twins, and the stages that
count them, each called as it exists on the base commit too (`kernelswarm sol`, the evaluator's
`score.score_workload`, `up`'s `cpu_sized`), so that a test fails there for the attack, not for a
missing name."""

from __future__ import annotations

import json
import os
import secrets
import signal
from pathlib import Path

import pytest

from kernelswarm.cli import main
from shared.schema import Definition, Workload, load_problem
from shared.sol_count import WorkCount, count_work

REPO = Path(__file__).resolve().parents[2]
RUN = "\n\ndef run(x):\n    return x * 2\n"
SIZE = 1024


def definition(name: str, attack: str) -> Definition:
    """A problem `name` whose reference runs `attack` at import, then doubles its input."""
    return Definition.model_validate({
        "name": name, "axes": {"n": {"type": "var"}}, "inputs": {"x": {"shape": ["n"], "dtype": "float32"}},
        "outputs": {"y": {"shape": ["n"], "dtype": "float32"}}, "reference": attack + RUN})


def workload() -> Workload:
    return Workload.model_validate({"uuid": "w1", "axes": {"n": SIZE}, "inputs": {"x": {"type": "random"}}})


def honest_work() -> WorkCount:
    """The twin's count, in this process: the reference without the attack (trusted here)."""
    return count_work(definition("honest", ""), workload())


def write_problem(folder: Path, name: str, attack: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "definition.json").write_text(definition(name, attack).model_dump_json(exclude_unset=True))
    (folder / "workload.jsonl").write_text(workload().model_dump_json() + "\n")
    return folder


def sol_rows(folder: Path, capsys: pytest.CaptureFixture[str], time_s: float = 60.0) -> list[dict]:
    """`kernelswarm sol FOLDER --json`: the rows it prints."""
    capsys.readouterr()
    assert main(["sol", str(folder), "--json", "--time-s", str(time_s)]) == 0
    return json.loads(capsys.readouterr().out)


def counted_as_honest(row: dict) -> bool:
    work = honest_work()
    return (row.get("t_sol_ms") is not None and row["matrix_flops"] == work.total_matrix_flops
            and row["vector_flops"] == work.vector_flops and row["bytes_moved"] == work.bytes_moved)


def token() -> str:
    return secrets.token_hex(6)


def load(folder: Path):
    return load_problem(folder, with_seeds=False)


def processes_named(comm: str) -> list[int]:
    """The pids of the live processes (not zombies) whose name (/proc/<pid>/comm) is `comm`."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if Path(f"/proc/{name}/comm").read_text().strip() == comm and state not in ("Z", "X"):
                    found.append(int(name))
            except (OSError, IndexError):
                pass
    return found


def kill_all(pids: list[int]) -> None:
    """The daemons a failing test leaves (the base commit's): each by its pid."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

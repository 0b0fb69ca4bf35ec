"""`kernelswarm problems import DIR`: every SOL-ExecBench problem of the sample folder, found
recursively, is registered under its definition's name, and a campaign created over them lists them
on the leaderboard; a problem whose data files are missing is refused with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernelswarm.cli import main
from shared.db import Database
from shared.leaderboard import leaderboard
from shared.schema.problem import find_problems
from shared.settings import Settings

SAMPLE = Path(__file__).resolve().parents[3] / "shared" / "sol-execbench-sample"
MISSING_DATA = "016_gqa_ragged_prefill_causal_h32_kv4_d128"  # its workloads' safetensors blobs are not in the sample

pytestmark = pytest.mark.skipif(not SAMPLE.is_dir(), reason=f"no SOL-ExecBench sample at {SAMPLE}")


def sample_names() -> dict[str, str]:
    """Folder name -> the problem's SOL-ExecBench name (its definition's `name`), read from the files."""
    return {folder.name: json.loads((folder / "definition.json").read_text())["name"]
            for folder in find_problems([SAMPLE])}


def test_a_campaign_over_the_sample_lists_its_problems_on_the_leaderboard(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    monkeypatch.setenv("KERNELSWARM_HOME", str(tmp_path / "home"))
    names = sample_names()
    assert len(names) == 30
    expected = sorted(name for folder, name in names.items() if folder != MISSING_DATA)

    assert main(["problems", "import", str(SAMPLE), "--campaign", "sample", "--json"]) == 1  # one refused
    report = json.loads(capsys.readouterr().out)
    assert sorted(report["registered"]) == expected
    [(refused, reason)] = report["refused"].items()
    assert refused.endswith(MISSING_DATA) and "no such file (safetensors data of `qo_indptr`" in reason

    db = Database(Settings.from_env().db_url)
    with db.session() as session:
        board = leaderboard(session, report["campaign"])
    assert sorted(entry.name for entry in board.problems) == expected
    assert {entry.status for entry in board.problems} == {"NO_ATTEMPTS"}

    assert main(["problems", "import", str(SAMPLE / "L1"), "--json"]) == 0  # again: updated in place, no campaign
    again = json.loads(capsys.readouterr().out)
    assert again["campaign"] is None and set(again["registered"]) < set(expected)
    with db.session() as session:
        assert sorted(e.name for e in leaderboard(session, report["campaign"]).problems) == expected
        assert len(leaderboard(session).problems) == len(expected)  # no duplicate rows


def test_a_folder_without_problems_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]):
    monkeypatch.setenv("KERNELSWARM_HOME", str(tmp_path / "home"))
    assert main(["problems", "import", str(tmp_path)]) == 2
    assert "no definition.json at or below it" in " ".join(capsys.readouterr().err.split())

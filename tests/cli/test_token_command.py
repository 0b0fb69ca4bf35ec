"""`kernelswarm token` prints a strong submit token; `kernelswarm up` refuses a weak one before it
starts anything (issue 25, the web's keys)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelswarm.cli import main
from kernelswarm.launcher import free_port
from services.web.tokens import weakness


def test_token_prints_a_new_strong_token_alone_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    tokens = []
    for _ in range(2):
        assert main(["token"]) == 0
        out, err = capsys.readouterr()
        [token] = out.splitlines()
        tokens.append(token)
        assert "KERNELSWARM_SUBMIT_TOKEN" in err
    assert tokens[0] != tokens[1]
    assert all(len(t) == 43 and weakness(t) is None for t in tokens)


@pytest.mark.parametrize("token", ["letmein", "kernelswarm" * 3])
def test_up_refuses_a_weak_token_before_starting_anything(token: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KERNELSWARM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KERNELSWARM_SUBMIT_TOKEN", token)
    assert main(["up", "--device", "cpu", "--port", str(free_port()), "--duration", "1"]) == 2
    message = " ".join(capsys.readouterr().err.split())
    assert "KERNELSWARM_SUBMIT_TOKEN is too weak" in message and "kernelswarm token" in message
    assert not (tmp_path / "home").exists()  # no Redis, no database, no logs

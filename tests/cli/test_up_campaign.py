"""`kernelswarm up` continues the campaign an earlier `up` left, says what the campaign does (idle,
stopped, working again) and each problem's progress; `kernelswarm reset` deletes the home."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from kernelswarm import up
from kernelswarm.cli import main
from services.planner.campaign import pause_campaign
from shared.db import AttemptRow, CampaignProblemRow, CampaignRow, Database, ProblemRow, SolutionRow
from shared.settings import Settings


@pytest.fixture
def db(tmp_path):
    database = Database(f"sqlite:///{tmp_path}/up.db")
    yield database
    database.dispose()


def problems(db: Database, *names: str) -> list[int]:
    with db.session() as session:
        rows = [ProblemRow(name=name, definition_json="{}", workloads_jsonl="") for name in names]
        session.add_all(rows)
        session.flush()
        return [r.id for r in rows]


def attempt(db: Database, problem_id: int, campaign_id: int, status: str, speedup: float | None = None,
            number: int = 0) -> None:
    digest = f"{problem_id:032d}{number:032d}"
    with db.session() as session:
        session.add(SolutionRow(hash=digest, problem_id=problem_id, name=f"s{number}", author="t", language="pytorch"))
        session.flush()
        session.add(AttemptRow(id=f"a-{problem_id}-{number}", problem_id=problem_id, solution_hash=digest,
                               campaign_id=campaign_id, status=status, device="cpu", speedup=speedup))


def test_the_second_up_continues_the_campaign_the_first_left_and_new_problems_join_it(db, tmp_path):
    settings = Settings(home=tmp_path, device="cpu")
    first, second = problems(db, "rmsnorm", "swiglu")
    campaign_id, said = up._campaign_for(db, settings, [first], new=False)
    assert said == f"campaign {campaign_id} is new (1 problems)"
    attempt(db, first, campaign_id, "PASSED", 1.5)
    pause_campaign(db, campaign_id, up.PAUSED_BY_UP)  # what `up` does when it ends

    again, said = up._campaign_for(db, settings, [first, second], new=False)

    assert again == campaign_id
    assert said.startswith(f"continuing campaign {campaign_id} from ") and "1 attempts so far, 1 passed" in said
    assert "1 new problems join it" in said
    with db.session() as session:
        campaign = session.get(CampaignRow, campaign_id)
        assert (campaign.status, campaign.status_reason, campaign.continuous) == ("RUNNING", None, True)
        joined = session.query(CampaignProblemRow).filter_by(campaign_id=campaign_id).order_by("position").all()
        assert [(c.problem_id, c.position) for c in joined] == [(first, 0), (second, 1)]


def test_up_new_stops_the_earlier_campaign_and_starts_another(db, tmp_path):
    settings = Settings(home=tmp_path, device="cpu")
    (problem,) = problems(db, "rmsnorm")
    earlier, _ = up._campaign_for(db, settings, [problem], new=False)
    other_device, _ = up._campaign_for(db, settings.model_copy(update={"device": "cuda"}), [problem], new=False)

    fresh, said = up._campaign_for(db, settings, [problem], new=True)

    assert fresh not in (earlier, other_device) and said.endswith("is new (1 problems)")
    with db.session() as session:
        assert session.get(CampaignRow, earlier).status == "STOPPED"
        assert "--new" in session.get(CampaignRow, earlier).status_reason
        assert session.get(CampaignRow, other_device).status == "RUNNING"  # another device's: left alone


def test_the_console_says_each_change_of_state_once_and_each_problems_progress(db, tmp_path):
    (problem,) = problems(db, "swiglu")
    campaign_id, _ = up._campaign_for(db, Settings(home=tmp_path, device="cpu"), [problem], new=False)
    attempt(db, problem, campaign_id, "COMPILE_ERROR", number=1)
    attempt(db, problem, campaign_id, "PASSED", 2.25, number=2)
    attempt(db, problem, campaign_id, "PENDING", number=3)
    assert up._progress(db, campaign_id) == {"swiglu": "2 attempts, 1 passed, best 2.25x, last PASSED, 1 in flight"}

    out = io.StringIO()
    console = Console(file=out, width=300)
    up._say_state(campaign_id, ("RUNNING", "idle: every problem retired (1)"), 12, console)
    up._say_state(campaign_id, ("RUNNING", None), 20, console)
    up._say_state(campaign_id, ("STOPPED", "token budget spent"), 30, console)
    lines = out.getvalue().splitlines()
    assert f"campaign {campaign_id} idle: every problem retired (1)" in lines[0] and "OPENAI_API_KEY" in lines[0]
    assert "KERNELSWARM_SUBMIT_TOKEN" in lines[0] and "Ctrl-C stops" in lines[0]
    assert lines[1].endswith(f"campaign {campaign_id} is working again")
    assert f"campaign {campaign_id} STOPPED: token budget spent; still serving" in lines[2]


def test_reset_deletes_the_home_only_when_confirmed(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    (home / "store").mkdir(parents=True)
    (home / "kernelswarm.db").write_text("x")
    monkeypatch.setenv("KERNELSWARM_HOME", str(home))
    monkeypatch.setenv("KERNELSWARM_DATABASE_URL", "postgresql://u:secret@db.example/ks")
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # not a terminal: nothing is asked

    assert main(["reset"]) == 2
    assert "pass --yes" in capsys.readouterr().err and (home / "kernelswarm.db").exists()

    assert main(["reset", "--yes"]) == 0
    err = " ".join(capsys.readouterr().err.split())  # the console wraps at its width
    assert not home.exists() and f"deleted {home}" in err
    assert "not touched: the DB at postgresql://u:**@db.example/ks" in err  # named, password masked

    assert main(["reset", "--yes"]) == 0
    assert "nothing to reset" in capsys.readouterr().err


def test_reset_refuses_while_up_serves_on_the_port(tmp_path, monkeypatch, capsys):
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    try:
        monkeypatch.setenv("KERNELSWARM_HOME", str(tmp_path))
        monkeypatch.setenv("KERNELSWARM_WEB_PORT", str(listener.getsockname()[1]))
        assert main(["reset", "--yes"]) == 2
        assert "stop `kernelswarm up` first" in capsys.readouterr().err and Path(tmp_path).exists()
    finally:
        listener.close()

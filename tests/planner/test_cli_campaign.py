"""`kernelswarm campaign create|list|pause|resume|stop`, in process, on a temp home; `resume` with a
real redis-server puts a `planner.tick` on the `plan` queue."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import redis

from kernelswarm.cli import main
from kernelswarm.launcher import RedisServer, free_port
from shared.celery_app import PLAN_QUEUE, PLAN_TICK

PROBLEMS = Path(__file__).resolve().parents[2] / "problems"


@pytest.fixture(autouse=True)
def _env(tmp_path, monkeypatch) -> None:
    for name in ("KERNELSWARM_REDIS_URL", "KERNELSWARM_DATABASE_URL", "KERNELSWARM_DEVICE", "KERNELSWARM_WRITERS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KERNELSWARM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KERNELSWARM_PROBLEMS_DIR", str(PROBLEMS))
    monkeypatch.setenv("COLUMNS", "200")


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, " ".join(out.err.split())


def listed(capsys) -> list[dict]:
    code, out, _ = run(capsys, "campaign", "list", "--json")
    assert code == 0
    return json.loads(out)


def test_create_over_the_library_with_budgets_then_list(capsys):
    code, out, err = run(capsys, "campaign", "create", "--name", "night", "--writers", "4", "--policy", "round_robin",
                         "--budget-attempts", "40", "--budget-gpu-s", "3600", "--budget-wall-s", "7200")
    assert code == 0, err
    assert out.strip() == "1"
    shipped = sum(1 for folder in PROBLEMS.iterdir() if (folder / "definition.json").exists())
    assert f"campaign 1 created: {shipped} problems, 4 writers, policy round_robin" in err
    assert "it starts at the next `kernelswarm up`" in err
    (campaign,) = listed(capsys)
    assert (campaign["name"], campaign["status"], campaign["policy"], campaign["writers"], campaign["problems"]) == (
        "night", "RUNNING", "round_robin", 4, shipped)
    assert campaign["budgets"] == {"attempts": 40, "gpu_s": 3600.0, "tokens": None, "wall_s": 7200.0}

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLUMNS", "200")
        code, out, _ = run(capsys, "campaign", "list")
        assert code == 0 and "night" in out and "0 / 40" in out and "7200" in out
        patch.setenv("COLUMNS", "80")
        code, out, _ = run(capsys, "campaign", "list")
    assert code == 0 and "night" in out and "0 / 40" in out and "7200" not in out  # the wall budget left out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_create_names_problems_and_rejects_unknown_ones(capsys):
    code, _, err = run(capsys, "campaign", "create", "llama31_8b_rmsnorm", "llama31_8b_swiglu")
    assert code == 0, err
    assert listed(capsys)[0]["problems"] == 2
    assert listed(capsys)[0]["policy"] == "headroom_ucb"  # the default policy

    code, _, err = run(capsys, "campaign", "create", "llama31_8b_rmsnorm", "no_such_problem")
    assert code == 2 and "error: no problem named 'no_such_problem'" in err
    with pytest.raises(SystemExit) as exited:  # argparse's refusal (kernelswarm/arguments.py)
        run(capsys, "campaign", "create", "--writers", "0")
    assert exited.value.code == 2 and "argument --writers: 0 is out of range" in capsys.readouterr().err
    assert len(listed(capsys)) == 1


def test_pause_resume_stop(capsys):
    run(capsys, "campaign", "create", "llama31_8b_rmsnorm")
    code, _, err = run(capsys, "campaign", "pause", "1")
    assert code == 0 and "campaign 1 PAUSED" in err
    assert listed(capsys)[0]["status"] == "PAUSED"
    code, _, err = run(capsys, "campaign", "resume", "1")
    assert code == 0 and "campaign 1 RUNNING: it resumes at the next `kernelswarm up`" in err
    code, _, err = run(capsys, "campaign", "stop", "1")
    assert code == 0 and "campaign 1 STOPPED" in err
    code, _, err = run(capsys, "campaign", "resume", "1")
    assert code == 2 and "campaign 1 is stopped; create a new one instead" in err
    code, _, err = run(capsys, "campaign", "pause", "9")
    assert code == 2 and "no campaign 9" in err


def test_resume_sends_a_tick_through_redis(capsys, tmp_path, monkeypatch):
    server = RedisServer(tmp_path / "redis")
    try:
        monkeypatch.setenv("KERNELSWARM_REDIS_URL", server.url)
        run(capsys, "campaign", "create", "llama31_8b_rmsnorm")  # a tick for the new campaign...
        run(capsys, "campaign", "pause", "1")
        code, _, err = run(capsys, "campaign", "resume", "1")  # ...and one for the resume
        masked = server.url.replace(redis.connection.parse_url(server.url)["password"], "**")  # its password
        assert code == 0 and f"planner.tick sent through {masked}" in err

        client = redis.Redis.from_url(server.url)
        messages = [json.loads(raw) for raw in client.lrange(PLAN_QUEUE, 0, -1)]
        client.close()
        assert [m["headers"]["task"] for m in messages] == [PLAN_TICK, PLAN_TICK]
        assert [json.loads(base64.b64decode(m["body"]))[0] for m in messages] == [[1], [1]]
    finally:
        server.stop()


def test_a_redis_password_is_never_printed(capsys, monkeypatch):
    """The tick's message names Redis: with its password masked, as Celery's banner does."""
    monkeypatch.setenv("KERNELSWARM_REDIS_URL", f"redis://:s3cret@127.0.0.1:{free_port()}/0")  # nobody listens
    code, out, err = run(capsys, "campaign", "create", "llama31_8b_rmsnorm")
    assert code == 2 and "did not take the tick" in err
    assert "s3cret" not in out + err and "redis://:**@127.0.0.1:" in err

"""Issue 40, row L and item 5's modes and passwords (the `small` part): each attack beside an honest
control through the same stage.

- the wrong-token throttle: 120 wrong tokens sent at once compare at most the allowed 10;
- every number of the `kernelswarm` CLI bounded (exit 2, the argument named, no traceback), and
  `eval -o` checked before the evaluation runs;
- KERNELSWARM_REFERENCE_UID a real setting;
- the swarm's home 0700, its DB 0600;
- `up`'s private Redis behind a random password.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import redis
from tests.attacks.smallkit import TOKEN, a_campaign, at_once, close_app, web_app

from kernelswarm.cli import build_parser, main
from kernelswarm.launcher import RedisServer, Services, settings_env
from services.evaluator.sandbox import isolation
from shared.db import Database
from shared.errors import UserError
from shared.runtime import Runtime
from shared.settings import Settings
from tests.cli.upsetup import prepare_up

REPO = Path(__file__).resolve().parents[2]
RMSNORM = REPO / "problems" / "llama31_8b_rmsnorm"
SEED = RMSNORM / "solutions" / "pytorch_seed.json"

LIMIT, WRONG_AT_ONCE = 10, 120


@pytest.fixture
def db(tmp_path):
    database = Database(f"sqlite:///{tmp_path}/t.db")
    yield database
    database.dispose()


# --- the wrong-token throttle ------------------------------------------------------------------------


def test_wrong_tokens_sent_at_once_compare_at_most_the_limit(tmp_path, db):
    """Attack: 120 wrong tokens at once from one address. Checked, then recorded in two steps, all
    of them passed the check before any was recorded (each a guess compared); counted before the
    comparison in the same step as the check, 10 are compared and 110 refused (429)."""
    app = web_app(tmp_path, db, token_failures_per_window=LIMIT)
    campaign = a_campaign(db)
    try:
        codes = at_once(WRONG_AT_ONCE, lambda: app.test_client().post(
            f"/api/campaigns/{campaign}/pause", headers={"Authorization": "Bearer wrong-" + TOKEN}).status_code)
        assert codes[401] == LIMIT and codes[429] == WRONG_AT_ONCE - LIMIT, codes
    finally:
        close_app(app)


def test_right_tokens_sent_at_once_all_pass_and_count_nothing(tmp_path, db):
    """Control: the right token, many at once (within the limit in flight), is taken every time and
    leaves nothing counted: a wrong one afterwards is still compared (401, not 429)."""
    app = web_app(tmp_path, db, token_failures_per_window=LIMIT)
    campaign = a_campaign(db)
    try:
        client = app.test_client()
        codes = at_once(LIMIT, lambda: app.test_client().post(
            f"/api/campaigns/{campaign}/pause", headers={"Authorization": f"Bearer {TOKEN}"}).status_code)
        assert codes == {200: LIMIT}, codes
        for _ in range(LIMIT):
            assert client.post(f"/api/campaigns/{campaign}/resume",
                               headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        assert client.post(f"/api/campaigns/{campaign}/pause",
                           headers={"Authorization": "Bearer wrong"}).status_code == 401
    finally:
        close_app(app)


# --- every number of the CLI bounded -----------------------------------------------------------------


@pytest.fixture
def home(tmp_path, monkeypatch):
    """The CLI's settings on a home of this test's, with the problems of the repository."""
    for name in [k for k in os.environ if k.startswith("KERNELSWARM_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("KERNELSWARM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KERNELSWARM_PROBLEMS_DIR", str(REPO / "problems"))
    monkeypatch.setenv("COLUMNS", "400")
    return tmp_path / "home"


def refused(capsys, argv: list[str], run: bool = False) -> str:
    """What the CLI said when it refused `argv` (exit code 2, no traceback); fails the test if it
    took it instead, or crashed. Parsed only (nothing of the command runs, even where it would be
    taken: `up`), or `run` through `main`."""
    with pytest.raises(SystemExit) as exited:
        main(argv) if run else build_parser().parse_args(argv)
    assert exited.value.code == 2
    said = capsys.readouterr().err
    assert "Traceback" not in said
    return " ".join(said.split())


@pytest.mark.parametrize(("argv", "named"), [
    (["leaderboard", "--campaign", "99999999999999999999"], "argument --campaign"),
    (["campaign", "pause", "99999999999999999999"], "argument ID"),
    (["campaign", "stop", "-3"], "argument ID"),
    (["up", "--port", "99999"], "argument --port"),
    (["up", "--port", "0"], "argument --port"),
    (["up", "--duration", "-5"], "argument --duration"),
    (["up", "--duration", "nan"], "argument --duration"),
    (["sol", "problems/x", "--memory-mb", "-5"], "argument --memory-mb"),
    (["sol", "problems/x", "--time-s", "inf"], "argument --time-s"),
    (["eval", "p", "--solution", "s.json", "--max-workloads", "99999999999999999999"], "argument --max-workloads"),
    (["campaign", "create", "--budget-attempts", "0"], "argument --budget-attempts"),
    (["campaign", "create", "--budget-tokens", "99999999999999999999"], "argument --budget-tokens"),
    (["campaign", "create", "--budget-gpu-s", "-1"], "argument --budget-gpu-s"),
    (["campaign", "create", "--budget-wall-s", "0"], "argument --budget-wall-s"),
    (["campaign", "create", "--attempts-per-assignment", "-1"], "argument --attempts-per-assignment"),
])
def test_a_number_out_of_range_is_refused_naming_its_argument(home, capsys, argv, named):
    """Attack: numbers past what the DB, a socket or a limit takes. Were: OverflowError tracebacks
    (ids, ports), a limit silently removed (--memory-mb -5), a negative duration accepted."""
    said = refused(capsys, argv)
    assert f"{named}: " in said and "out of range" in said, said


@pytest.mark.parametrize("argv", [["leaderboard", "--campaign", "99999999999999999999"],
                                  ["campaign", "pause", "99999999999999999999"]])
def test_an_id_past_the_db_is_refused_not_a_traceback(home, capsys, argv):
    """Attack, the whole command: were OverflowError tracebacks from the DB driver."""
    assert "out of range: an id is from 1 to 2147483647" in refused(capsys, argv, run=True)


def test_numbers_in_range_still_work(home, capsys):
    """Control: the same commands with numbers in range run as before."""
    parser = build_parser()
    assert parser.parse_args(["up", "--port", "65535", "--duration", "0.5"]).port == 65535
    assert parser.parse_args(["sol", "p", "--memory-mb", "2048", "--time-s", "20"]).memory_mb == 2048
    assert main(["campaign", "create", "llama31_8b_rmsnorm", "--writers", "2", "--budget-attempts", "5",
                 "--budget-wall-s", "60"]) == 0
    campaign = int(capsys.readouterr().out.strip())
    assert main(["campaign", "pause", str(campaign)]) == 0
    assert main(["leaderboard", "--campaign", str(campaign), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["campaign_id"] == campaign
    assert main(["leaderboard", "--campaign", str(2**31 - 1)]) == 2  # the largest id: looked up, not a crash
    assert "no campaign 2147483647" in capsys.readouterr().err


def test_eval_checks_its_output_file_before_evaluating(home, capsys, monkeypatch):
    """Attack: `eval -o /proc/nope/x` ran the whole evaluation, then crashed writing the traces.
    Now it is refused at once (exit 2, the path named); the evaluation is never started."""
    started = []
    monkeypatch.setattr("kernelswarm.cli._started_children", lambda *a: started.append(a))
    code = main(["eval", str(RMSNORM), "--solution", str(SEED), "-o", "/proc/nope/x"])
    said = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "-o /proc/nope/x: /proc/nope is not a folder" in said, said
    assert started == []
    assert main(["eval", str(RMSNORM), "--solution", str(SEED), "-o", str(home.parent)]) == 2  # a folder
    assert started == []


class Started(Exception):
    """Raised by the stand-in for the evaluation's start: the command got that far."""


def test_eval_with_a_writable_output_file_goes_on_to_evaluate(home, tmp_path, monkeypatch):
    """Control: a writable -o (new, or an existing file) is not refused: the evaluation starts
    (stopped there; tests/cli/test_cli_commands.py's eval tests write real traces with -o), and
    nothing is left in the output's folder by the check."""
    def start(*_args):
        raise Started

    monkeypatch.setattr("kernelswarm.cli._started_children", start)
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "old.jsonl").write_text("old")
    for name in ("traces.jsonl", "old.jsonl"):
        with pytest.raises(Started):
            main(["eval", str(RMSNORM), "--solution", str(SEED), "-o", str(folder / name)])
    assert [p.name for p in folder.iterdir()] == ["old.jsonl"]


# --- KERNELSWARM_REFERENCE_UID, a real setting ----------------------------------------------------------


def test_the_documented_reference_uid_setting_is_taken_and_reaches_the_sandbox(home, monkeypatch):
    """Was: every service refused to start with the documented KERNELSWARM_REFERENCE_UID ("unknown
    setting"). Now a setting, and the evaluator's entry point hands it to the sandbox."""
    settings = Settings.from_env({"KERNELSWARM_REFERENCE_UID": "61000"})
    assert settings.reference_uid == 61000
    monkeypatch.setattr(isolation, "_reference_uid", isolation.REFERENCE_UID)  # undone after the test
    entrypoint = (REPO / "services" / "evaluator" / "entrypoint.py").read_text()
    assert "use_reference_uid(settings.reference_uid)" in entrypoint  # the evaluator service's (imports torch: not run here)
    monkeypatch.setenv("KERNELSWARM_REFERENCE_UID", "61000")  # `kernelswarm eval`, as far as its settings
    monkeypatch.setattr("kernelswarm.cli._started_children", lambda *_: (_ for _ in ()).throw(Started()))
    with pytest.raises(Started):
        main(["eval", str(RMSNORM), "--solution", str(SEED)])
    assert isolation.reference_uid() == 61000


@pytest.mark.parametrize("value", ["0", "-1", "65534", "root", "4294967295"])
def test_a_reference_uid_that_is_not_its_own_is_refused(value):
    """Control: root's, nobody's (the candidate's), a name or past the uid range: refused, named."""
    with pytest.raises(UserError, match="KERNELSWARM_REFERENCE_UID"):
        Settings.from_env({"KERNELSWARM_REFERENCE_UID": value})
    assert Settings.from_env({}).reference_uid == isolation.REFERENCE_UID == 65533


# --- the swarm's own files: home 0700, DB 0600 ----------------------------------------------------------


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.sqlite_only("the modes of the SQLite file")
def test_a_new_home_and_its_db_and_store_are_the_owners_alone(tmp_path):
    """Attack: with the home 0755 and the DB 0644, any local user (or a sandboxed child of another
    uid) read the DB, which holds the web's session key. Made now: home 0700, DB 0600, store 0700;
    the DB still opens and works (control)."""
    previous = os.umask(0o022)  # the usual umask: the modes must not depend on it
    try:
        settings = Settings(home=tmp_path / "home")
        runtime = Runtime(settings)
        assert a_campaign(runtime.db) == 1  # the control: a DB that works
        digest = runtime.store.put(b"x")
        assert runtime.store.get(digest) == b"x"
    finally:
        os.umask(previous)
    db_file = settings.home / "kernelswarm.db"
    assert mode(settings.home) == 0o700 and mode(db_file) == 0o600 and mode(settings.home / "store") == 0o700
    for beside in (db_file.with_name("kernelswarm.db-wal"), db_file.with_name("kernelswarm.db-shm")):
        assert not beside.exists() or mode(beside) & 0o077 == 0
    runtime.db.dispose()


@pytest.mark.sqlite_only("the modes of the SQLite file")
def test_an_existing_home_found_open_is_tightened(tmp_path, monkeypatch, capsys):
    """Attack: a home left 0755 with a DB 0644 by an earlier version. Any CLI command (here
    `campaign list`) tightens both, and still reads the DB (control: its campaign listed)."""
    home = tmp_path / "home"
    home.mkdir()
    db = Database(f"sqlite:///{home}/kernelswarm.db")
    a_campaign(db)
    db.dispose()
    os.chmod(home, 0o755)
    os.chmod(home / "kernelswarm.db", 0o644)
    for name in [k for k in os.environ if k.startswith("KERNELSWARM_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("KERNELSWARM_HOME", str(home))
    assert main(["campaign", "list", "--json"]) == 0
    assert [c["id"] for c in json.loads(capsys.readouterr().out)] == [1]
    assert mode(home) == 0o700 and mode(home / "kernelswarm.db") == 0o600


@pytest.mark.sqlite_only("the modes of the SQLite file")
def test_a_db_in_a_shared_folder_leaves_the_folder_alone(tmp_path):
    """Control: only the DB's own files are tightened, never a folder it lies in (/tmp)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    db = Database(f"sqlite:///{shared}/k.db")
    db.dispose()
    assert mode(shared) == 0o1777 and mode(shared / "k.db") == 0o600


# --- `up`'s private Redis behind a random password -------------------------------------------------------


def test_ups_redis_refuses_a_client_without_its_password(tmp_path):
    """Attack: any local process (a candidate of the CPU evaluator with a network, another user)
    connected to `up`'s redis-server on 127.0.0.1 and read or wrote the queues. Now it answers
    only with the random password, which is not on its command line (`ps`) but in a 0600 file."""
    server = RedisServer(tmp_path / "redis")
    try:
        stranger = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=5)
        with pytest.raises(redis.AuthenticationError):
            stranger.ping()
        stranger.close()
        password = redis.connection.parse_url(server.url)["password"]
        assert len(password) >= 32
        assert password.encode() not in Path(f"/proc/{server.process.pid}/cmdline").read_bytes()
        assert mode(server.config) == 0o600
        client = redis.Redis.from_url(server.url, socket_timeout=5)  # the control: its URL works
        assert client.ping() and client.set("k", "v") and client.get("k") == b"v"
        client.close()
        server.restart()  # the same password after a restart (clients keep their URL)
        client = redis.Redis.from_url(server.url, socket_timeout=5)
        assert client.ping()
        client.close()
    finally:
        server.stop()


class CheckingServices(Services):
    """`up`'s services, replaced: they check the Redis URL they were given, then stop `up`."""

    seen: list[str] = []

    def start(self) -> None:
        url = settings_env(self.settings)["KERNELSWARM_REDIS_URL"]
        CheckingServices.seen.append(url)
        client = redis.Redis.from_url(url, socket_timeout=5)
        try:
            assert client.ping()
        finally:
            client.close()
        raise KeyboardInterrupt  # `up` stops as on Ctrl-C


@pytest.mark.sqlite_only("the modes of the SQLite file")
def test_up_gives_its_services_the_url_with_the_password(tmp_path, monkeypatch):
    """Control: the services `up` starts get the URL with the password, and it works. The home `up`
    made is its owner's alone, its DB too."""
    prepare_up(tmp_path, monkeypatch, CheckingServices)
    CheckingServices.seen.clear()
    assert main(["up", "--duration", "60"]) == 0
    [url] = CheckingServices.seen
    assert redis.connection.parse_url(url)["password"]
    home = tmp_path / "home"
    assert mode(home) == 0o700 and mode(home / "kernelswarm.db") == 0o600 and mode(home / "redis") == 0o700


# --- the same bounds on the settings ----------------------------------------------------------------------


@pytest.mark.parametrize(("variable", "value"), [("KERNELSWARM_WEB_PORT", "99999"), ("KERNELSWARM_WEB_PORT", "0"),
                                                 ("KERNELSWARM_SOL_COUNT_MEMORY_MB", "-5"),
                                                 ("KERNELSWARM_SOL_COUNT_TIME_S", "inf"),
                                                 ("KERNELSWARM_TOKEN_FAILURES_PER_WINDOW", "0")])
def test_the_same_numbers_from_the_environment_are_refused_too(variable, value):
    """Attack, by the settings' door: `KERNELSWARM_WEB_PORT=99999 kernelswarm up` ended as `--port`
    did, a negative memory limit removed the limit, a throttle of 0 failures was taken."""
    with pytest.raises(UserError, match=variable):
        Settings.from_env({variable: value})


def test_numbers_in_range_from_the_environment_are_taken():
    """Control."""
    settings = Settings.from_env({"KERNELSWARM_WEB_PORT": "65535", "KERNELSWARM_SOL_COUNT_MEMORY_MB": "1",
                                  "KERNELSWARM_SOL_COUNT_TIME_S": "0.5", "KERNELSWARM_TOKEN_FAILURES_PER_WINDOW": "1"})
    assert (settings.web_port, settings.sol_count_memory_mb, settings.sol_count_time_s,
            settings.token_failures_per_window) == (65535, 1, 0.5, 1)

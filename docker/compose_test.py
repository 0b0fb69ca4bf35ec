"""The CPU cluster under docker compose, end to end (`make compose-test`, run by CI).

    python docker/compose_test.py [--json OUT] [--keep] [--upstream]

1. The Docker engine: installed (Debian's docker.io, docker-compose, debootstrap) when missing and
   started when not running. Where it cannot start, the test says so and ends SKIPPED (exit 0): the
   only case that is not a pass or a failure.
2. The base images from docker/local-bases.sh (registry-free), or the upstream ones (`--upstream`).
   MinIO's image where it can be pulled, else the S3 stand-in (docker/compose.s3-standin.yml).
3. `docker compose build`, then `up -d` of the whole CPU stack (docker/compose.cpu.yml, profile
   `cpu`), on free ports, in a project of its own (`kernelswarm-compose-test`); every service healthy.
4. A short campaign through it: a campaign over two library problems created in the planner's
   container, a problem submitted over HTTP joining it; attempts recorded in PostgreSQL, their
   sources and traces in the object store, the leaderboard over HTTP.
5. Mid-campaign, one container of each kind is killed (SIGKILL to its main process, as a crash) and
   Docker's restart policy brings it back; afterwards nothing recorded is lost, no attempt stays in
   flight, and a problem submitted after the restarts gets its reference attempt PASSED.
6. `down -v`, whatever happened (`--keep` leaves the stack up to look at).

Prints each step, then a table; `--json` writes the figures (build times, image sizes, the
campaign's, the restarts'). docs/deploy.md, "The CPU stack" and "Without a registry".
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import closing
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROJECT = "kernelswarm-compose-test"
FILES = ["docker-compose.yml", "docker/compose.cpu.yml"]
STANDIN = "docker/compose.s3-standin.yml"
MINIO_IMAGE = "minio/minio:RELEASE.2025-04-22T22-12-26Z"
LIBRARY_PROBLEMS = ["llama31_8b_rmsnorm", "qwen3_moe_topk_router"]  # small enough for a CPU
SUBMITTED = "compose_test_gelu"  # submitted over HTTP once the campaign runs
SUBMITTED_AFTER = "compose_test_gelu_after"  # and one after the restarts
# Every service but the one-shot `init`: each waited for, and each killed once.
KINDS = ["redis", "postgres", "minio", "planner", "worker", "evaluator-cpu", "web", "flower"]
IN_FLIGHT = ("PENDING", "RUNNING")
HEALTHY_WAIT_S = 300.0
ATTEMPTS_BEFORE_KILLS = 3
SETTLE_WAIT_S = 420.0
START = time.monotonic()


class Skip(Exception):
    """Docker cannot run here: the test ends SKIPPED, saying why."""


class Failed(Exception):
    pass


def say(text: str) -> None:
    print(f"[compose-test {time.monotonic() - START:6.1f} s] {text}", flush=True)


def run(cmd: list[str], *, check: bool = True, timeout: float = 600, quiet: bool = False,
        env: dict | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    if check and done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-30:])
        raise Failed(f"{' '.join(cmd[:6])} ... exited with {done.returncode}:\n{tail}")
    if not quiet and done.returncode != 0:
        say(f"{' '.join(cmd[:4])} ... exited with {done.returncode}")
    return done


def sudo() -> list[str]:
    return [] if os.geteuid() == 0 else ["sudo", "-n"]


# --- 1. the engine -------------------------------------------------------------------------------

def engine() -> None:
    # dockerd too: a machine may have Docker's client without its engine.
    missing = [tool for tool in ("docker", "dockerd", "docker-compose", "debootstrap") if shutil.which(tool) is None]
    if missing:
        say(f"installing {', '.join(missing)} (Debian's docker.io, docker-compose, debootstrap)")
        try:
            run([*sudo(), "apt-get", "update", "-qq"], timeout=300)
            run([*sudo(), "apt-get", "install", "-y", "-qq", "--no-install-recommends",
                 "docker.io", "docker-compose", "debootstrap"], timeout=600)
        except (Failed, FileNotFoundError) as error:
            raise Skip(f"Docker could not be installed: {error}") from error
    if run(["docker", "info"], check=False, quiet=True).returncode == 0:
        say("Docker engine running")
        return
    log = REPO / ".kernelswarm" / "compose-test" / "dockerd.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    say(f"starting dockerd (log: {log.relative_to(REPO)})")
    with log.open("ab") as out:
        try:
            subprocess.Popen([*sudo(), "dockerd"], stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        except OSError as error:
            raise Skip(f"dockerd cannot be started: {error}") from error
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if run(["docker", "info"], check=False, quiet=True).returncode == 0:
            say("Docker engine started")
            return
        time.sleep(1)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-5:])
    raise Skip(f"the Docker engine did not start within 60 s; the end of its log:\n{tail}")


# --- 2-3. images and the stack -------------------------------------------------------------------

def free_port() -> int:
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def minio_available() -> bool:
    if run(["docker", "image", "inspect", MINIO_IMAGE], check=False, quiet=True).returncode == 0:
        return True
    try:
        return run(["docker", "pull", "-q", MINIO_IMAGE], check=False, quiet=True, timeout=60).returncode == 0
    except subprocess.TimeoutExpired:
        return False


class Stack:
    def __init__(self, env_file: Path, files: list[str]) -> None:
        self.env_file = env_file
        self.files = files
        self.env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
        self.containers: dict[str, str] = {}  # service -> container id; a restart keeps the container

    def compose(self, *args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
        cmd = ["docker-compose", "-p", PROJECT, "--env-file", str(self.env_file), "--profile", "cpu"]
        for name in self.files:
            cmd += ["-f", name]
        return run([*cmd, *args], check=check, timeout=timeout,
                   env={"DOCKER_BUILDKIT": "0", "COMPOSE_DOCKER_CLI_BUILD": "0"})

    def container(self, service: str) -> str:
        if service not in self.containers:
            ids = self.compose("ps", "-q", service).stdout.split()
            if not ids:
                raise Failed(f"no container for {service}")
            self.containers[service] = ids[0]
        return self.containers[service]

    def inspect(self, service: str) -> dict:
        return json.loads(run(["docker", "inspect", self.container(service)]).stdout)[0]

    def state(self, service: str) -> tuple[str, str]:
        state = self.inspect(service)["State"]
        return state["Status"], (state.get("Health") or {}).get("Status", "none")

    def exec(self, service: str, *cmd: str, timeout: float = 120) -> str:
        return self.compose("exec", "-T", service, *cmd, timeout=timeout).stdout

    def sql(self, query: str) -> list[list[str]]:
        out = self.exec("postgres", "psql", "-U", self.env["POSTGRES_USER"], "-d", self.env["POSTGRES_DB"],
                        "-tA", "-F", "\t", "-c", query)
        return [line.split("\t") for line in out.splitlines() if line]


def write_env(path: Path, bases: dict[str, str], standin: bool) -> None:
    env = {
        **bases,
        "COMPOSE_PROFILES": "cpu",
        "IMAGE_TAG": "compose-test",
        "KERNELSWARM_DEVICE": "cpu",
        "POSTGRES_USER": "kernelswarm", "POSTGRES_DB": "kernelswarm",
        "POSTGRES_PASSWORD": secrets.token_urlsafe(16), "REDIS_PASSWORD": secrets.token_urlsafe(16),
        "MINIO_ROOT_USER": "S3RVER" if standin else "kernelswarm",
        "MINIO_ROOT_PASSWORD": "S3RVER" if standin else secrets.token_urlsafe(16),
        "MINIO_BUCKET": "kernelswarm",
        "KERNELSWARM_SUBMIT_TOKEN": secrets.token_urlsafe(32),
        # Lost work found sooner than the defaults (15 s, 60 s): the restarts below lose some.
        "KERNELSWARM_SWEEP_EVERY_S": "5", "KERNELSWARM_LEASE_S": "30",
        "KERNELSWARM_WRITERS": "2",
        # Fewer timed runs per workload than the default (20 runs, 1 s): this checks the stack, not
        # kernels, and CI runs it beside the test suite on the same two cores.
        "KERNELSWARM_TIMING_RUNS": "5", "KERNELSWARM_TIMING_BUDGET_S": "0.25",
        "WEB_WORKERS": "2",
    }
    for name in ("WEB_PORT", "REDIS_PORT", "POSTGRES_PORT", "MINIO_PORT", "MINIO_CONSOLE_PORT", "FLOWER_PORT"):
        env[name] = str(free_port())
    path.write_text("".join(f"{k}={v}\n" for k, v in env.items()))


def wait_healthy(stack: Stack, services: list[str], timeout_s: float) -> dict[str, float]:
    """Seconds until each service was running and healthy (or running, without a health check)."""
    started, ready = time.monotonic(), {}
    while True:
        for service in services:
            if service in ready:
                continue
            status, health = stack.state(service)
            if status == "running" and health in ("healthy", "none"):
                ready[service] = round(time.monotonic() - started, 1)
        if len(ready) == len(services):
            return ready
        if time.monotonic() - started > timeout_s:
            states = {s: stack.state(s) for s in services if s not in ready}
            raise Failed(f"not healthy within {timeout_s:.0f} s: {states}")
        time.sleep(2)


# --- 4. the campaign -----------------------------------------------------------------------------

def http(stack: Stack, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
    url = f"http://127.0.0.1:{stack.env['WEB_PORT']}{path}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    if body is not None:
        request.add_header("Content-Type", "application/json")
        request.add_header("Authorization", f"Bearer {stack.env['KERNELSWARM_SUBMIT_TOKEN']}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def submitted_problem(name: str) -> dict:
    """whisper_gelu's definition under another name, with two small workloads: a problem a person
    would paste into the form."""
    definition = json.loads((REPO / "problems" / "whisper_gelu" / "definition.json").read_text())
    definition["name"] = name
    lines = (REPO / "problems" / "whisper_gelu" / "workload.jsonl").read_text().splitlines()
    workloads = []
    for i, tokens in enumerate((64, 256)):
        row = json.loads(lines[0])
        row["uuid"] = f"00000000-0000-4000-8000-00000000000{i}"
        row["axes"] = {"num_tokens": tokens}
        workloads.append(json.dumps(row))
    return {"definition": json.dumps(definition), "workloads": "\n".join(workloads) + "\n"}


def submit(stack: Stack, name: str) -> dict:
    status, body = http(stack, "POST", "/api/problems", submitted_problem(name))
    if status != 201:
        raise Failed(f"POST /api/problems ({name}): {status} {body[:500]!r}")
    answer = json.loads(body)
    if not answer["queued"] or not answer["attempt_ids"]:
        raise Failed(f"{name}: no reference attempt queued: {answer}")
    return answer


def attempts(stack: Stack) -> dict[str, tuple[str, str, str, str]]:
    """id -> (problem, status, solution hash, traces hash) of every attempt."""
    rows = stack.sql("SELECT a.id, p.name, a.status, a.solution_hash, coalesce(a.traces_hash, '') "
                     "FROM attempts a JOIN problems p ON p.id = a.problem_id")
    return {row[0]: tuple(row[1:]) for row in rows}


def finished(rows: dict) -> int:
    return sum(1 for row in rows.values() if row[1] not in IN_FLIGHT)


def wait_finished(stack: Stack, at_least: int, timeout_s: float, what: str) -> dict:
    deadline, last = time.monotonic() + timeout_s, -1
    while True:
        rows = attempts(stack)
        if finished(rows) != last:
            last = finished(rows)
            say(f"{what}: {last} attempts finished, {len(rows) - last} in flight")
        if last >= at_least:
            return rows
        if time.monotonic() > deadline:
            raise Failed(f"{what}: {last} attempts finished within {timeout_s:.0f} s, wanted {at_least}")
        time.sleep(3)


def unreadable(stack: Stack, digests: set[str]) -> list[str]:
    """The digests the object store cannot give back intact, read through the project's own store
    (it checks each object's SHA-256 against its name)."""
    from minio import Minio

    from shared.errors import StoreError
    from shared.store import MinioStore

    client = Minio(f"127.0.0.1:{stack.env['MINIO_PORT']}", access_key=stack.env["MINIO_ROOT_USER"],
                   secret_key=stack.env["MINIO_ROOT_PASSWORD"], secure=False)
    store = MinioStore(client, stack.env["MINIO_BUCKET"])
    bad = []
    for digest in sorted(digests):
        try:
            store.get(digest)
        except StoreError as error:
            bad.append(f"{digest[:12]}: {error}")
    return bad


# --- 5. the restarts -----------------------------------------------------------------------------

def crash_and_wait(stack: Stack, service: str, timeout_s: float = 120) -> dict:
    info = stack.inspect(service)
    count, pid = info["RestartCount"], info["State"]["Pid"]
    run([*sudo(), "kill", "-KILL", str(pid)])
    killed = time.monotonic()
    while True:
        info = stack.inspect(service)
        if info["RestartCount"] > count and info["State"]["Status"] == "running":
            return {"service": service, "exit_code": None, "restart_count": info["RestartCount"],
                    "running_after_s": round(time.monotonic() - killed, 1)}
        if time.monotonic() - killed > timeout_s:
            raise Failed(f"{service} was not restarted within {timeout_s:.0f} s: {info['State']}")
        time.sleep(0.5)


# --- the whole test ------------------------------------------------------------------------------

def image_size_mb(image: str) -> float:
    out = run(["docker", "image", "inspect", "-f", "{{.Size}}", image], check=False, quiet=True).stdout.strip()
    return round(int(out) / 1e6) if out.isdigit() else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--keep", action="store_true", help="leave the stack up at the end")
    parser.add_argument("--upstream", action="store_true", help="the upstream base images (a registry)")
    args = parser.parse_args()
    report: dict = {"project": PROJECT}
    work = REPO / ".kernelswarm" / "compose-test"
    work.mkdir(parents=True, exist_ok=True)
    try:
        engine()
    except Skip as skip:
        say(f"SKIPPED: {skip}")
        return 0

    stack = None
    try:
        bases: dict[str, str] = {}
        if not args.upstream:
            say("local base images (docker/local-bases.sh)")
            begun = time.monotonic()
            out = run([*sudo(), str(REPO / "docker" / "local-bases.sh")], timeout=1200)
            report["bases_s"] = round(time.monotonic() - begun, 1)
            bases = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
            say(f"bases ready in {report['bases_s']} s")
        standin = not minio_available()
        say("object store: " + ("the S3 stand-in (s3rver), MinIO's image cannot be pulled" if standin
                                else f"MinIO ({MINIO_IMAGE})"))
        report["object_store"] = "s3rver stand-in" if standin else MINIO_IMAGE
        env_file = work / "compose.env"
        write_env(env_file, bases, standin)
        stack = Stack(env_file, FILES + ([STANDIN] if standin else []))
        stack.compose("down", "-v", "--remove-orphans", check=False)  # a previous run's leftovers

        say("docker compose build (the CPU image)")
        begun = time.monotonic()
        stack.compose("build", "planner", timeout=1800)
        report["build_s"] = round(time.monotonic() - begun, 1)
        images = sorted(set(bases.values()) | {f"kernelswarm-cpu:{stack.env['IMAGE_TAG']}"})
        report["images_mb"] = {image: image_size_mb(image) for image in images}
        say(f"built in {report['build_s']} s")

        say("docker compose up -d")
        begun = time.monotonic()
        stack.compose("up", "-d", "--no-build", timeout=600)
        report["healthy_s"] = wait_healthy(stack, KINDS, HEALTHY_WAIT_S)
        init_exit = stack.inspect("init")["State"]["ExitCode"]
        if init_exit != 0:
            raise Failed(f"init exited with {init_exit}")
        report["up_to_healthy_s"] = round(time.monotonic() - begun, 1)
        say(f"every service healthy {report['up_to_healthy_s']} s after up (init exited 0)")

        out = stack.exec("planner", "kernelswarm", "campaign", "create", "--device", "cpu", "--name",
                         "compose-test", *LIBRARY_PROBLEMS)
        campaign_id = int(out.split()[0])
        say(f"campaign {campaign_id} created over {', '.join(LIBRARY_PROBLEMS)}")
        answer = submit(stack, SUBMITTED)
        if campaign_id not in answer["campaign_ids"]:
            raise Failed(f"the submitted problem did not join campaign {campaign_id}: {answer}")
        say(f"problem {SUBMITTED} submitted over HTTP: joined campaign {campaign_id}, "
            f"{len(answer['attempt_ids'])} reference attempt(s) queued")

        before = wait_finished(stack, ATTEMPTS_BEFORE_KILLS, SETTLE_WAIT_S, "before the restarts")
        done_before = {k: v for k, v in before.items() if v[1] not in IN_FLIGHT}

        report["restarts"] = []
        for service in KINDS:
            restart = crash_and_wait(stack, service)
            report["restarts"].append(restart)
            say(f"{service}: killed (SIGKILL), running again after {restart['running_after_s']} s "
                f"(restart count {restart['restart_count']})")
            time.sleep(3)
        healthy_again = wait_healthy(stack, KINDS, HEALTHY_WAIT_S)
        for restart in report["restarts"]:
            restart["healthy_after_all_s"] = healthy_again[restart["service"]]
        say("every service healthy again")

        # The whole path once more on the restarted services: web, PostgreSQL, Redis, the
        # evaluator, the object store. (The campaign itself may have ended by now: the built-in
        # tuner retires a problem whose search space it has tried.)
        answer = submit(stack, SUBMITTED_AFTER)
        say(f"problem {SUBMITTED_AFTER} submitted over HTTP after the restarts")
        deadline = time.monotonic() + SETTLE_WAIT_S
        while (states := {attempts(stack).get(a, ("", "PENDING"))[1] for a in answer["attempt_ids"]}) & set(IN_FLIGHT):
            if time.monotonic() > deadline:
                raise Failed(f"{SUBMITTED_AFTER}'s reference attempts not finished within {SETTLE_WAIT_S:.0f} s")
            time.sleep(3)
        if states != {"PASSED"}:
            raise Failed(f"{SUBMITTED_AFTER}'s reference attempts after the restarts: {states}")
        say(f"{SUBMITTED_AFTER}: its reference attempt PASSED on the restarted stack")
        [[campaign_status]] = stack.sql(f"SELECT status FROM campaigns WHERE id = {campaign_id}")
        if campaign_status != "STOPPED":
            status, body = http(stack, "POST", f"/api/campaigns/{campaign_id}/pause", {})
            if status != 200:
                raise Failed(f"pause: {status} {body[:300]!r}")
            campaign_status = "PAUSED"
        say(f"campaign {campaign_id} {campaign_status}; waiting for the attempts in flight")
        report["campaign_status"] = campaign_status
        deadline = time.monotonic() + SETTLE_WAIT_S
        while True:
            after = attempts(stack)
            if finished(after) == len(after):
                break
            if time.monotonic() > deadline:
                stuck = {k: v for k, v in after.items() if v[1] in IN_FLIGHT}
                raise Failed(f"attempts still in flight {SETTLE_WAIT_S:.0f} s after the pause: {stuck}")
            time.sleep(3)

        lost = [k for k, v in done_before.items() if after.get(k) != v]
        if lost:
            raise Failed(f"attempts finished before the restarts changed or vanished: {lost}")
        digests = {v[2] for v in after.values()} | {v[3] for v in after.values() if v[3]}
        missing = unreadable(stack, digests)
        if missing:
            raise Failed(f"{len(missing)} of {len(digests)} objects not readable from the store: {missing[:5]}")
        status, body = http(stack, "GET", f"/api/leaderboard?campaign={campaign_id}")
        board = json.loads(body)
        on_board = {row["name"]: row for row in board["problems"]}
        if status != 200 or not {*LIBRARY_PROBLEMS, SUBMITTED} <= set(on_board):
            raise Failed(f"leaderboard: {status}, problems {sorted(on_board)}")
        status, page = http(stack, "GET", "/")
        if status != 200 or not all(name.encode() in page for name in (SUBMITTED, SUBMITTED_AFTER)):
            raise Failed(f"GET /: {status}, the submitted problems not both on the page")

        by_status: dict[str, int] = {}
        for row in after.values():
            by_status[row[1]] = by_status.get(row[1], 0) + 1
        report["campaign"] = {
            "id": campaign_id, "attempts": len(after), "by_status": by_status,
            "finished_before_restarts": len(done_before), "objects_checked": len(digests),
            "problems": {name: {k: row.get(k) for k in ("status", "attempts", "passed_attempts", "speedup")}
                         for name, row in on_board.items()},
        }
        say(f"nothing lost: {len(done_before)} attempts finished before the restarts unchanged, "
            f"{len(after)} in all, none in flight; the {len(digests)} solutions and traces they name read "
            f"back intact from the store; the leaderboard and the home page list the problems")
        report["result"] = "PASSED"
    except Failed as failure:
        report["result"] = "FAILED"
        say(f"FAILED: {failure}")
        if stack is not None:
            logs = stack.compose("logs", "--no-color", "--tail", "40", check=False).stdout
            (work / "logs.txt").write_text(logs)
            say(f"the services' last log lines: {(work / 'logs.txt').relative_to(REPO)}")
    finally:
        if stack is not None and not args.keep:
            stack.compose("down", "-v", "--remove-orphans", check=False)
            say("docker compose down -v")
        report["total_s"] = round(time.monotonic() - START, 1)
        if args.json:
            args.json.write_text(json.dumps(report, indent=2) + "\n")
    print_table(report)
    return 0 if report.get("result") == "PASSED" else 1


def print_table(report: dict) -> None:
    print()
    print(f"compose-test: {report.get('result', '?')} in {report.get('total_s')} s "
          f"(bases {report.get('bases_s', '-')} s, build {report.get('build_s', '-')} s, "
          f"up to healthy {report.get('up_to_healthy_s', '-')} s)")
    for image, size in report.get("images_mb", {}).items():
        print(f"  image {image:48} {size:>7} MB")
    campaign = report.get("campaign")
    if campaign:
        print(f"  campaign {campaign['id']} ({report.get('campaign_status')}): {campaign['attempts']} attempts "
              f"{campaign['by_status']}, {campaign['finished_before_restarts']} finished before the restarts, "
              f"{campaign['objects_checked']} objects read back")
    for name, row in report.get("campaign", {}).get("problems", {}).items():
        print(f"  {name:32} {row['status']:12} attempts {row['attempts']:>3}  passed {row['passed_attempts']:>3}"
              f"  speedup {row['speedup'] if row['speedup'] is not None else '-'}")
    for restart in report.get("restarts", []):
        print(f"  restart {restart['service']:14} running after {restart['running_after_s']:>5} s, "
              f"healthy again {restart.get('healthy_after_all_s', '-')} s after the last kill")


if __name__ == "__main__":
    sys.exit(main())

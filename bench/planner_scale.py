"""The planner at scale: one tick at 10,000 problems, and assignments per second through Redis.

    python bench/planner_scale.py --out scale.json     (also run by planner_sim.py)

1. Pure tick: `policy.choose` over 10,000 problems with a history, for 1, 100 and 1,000 slots.
2. DB tick: a SQLite campaign of 10,000 problems and 50,000 finished attempts; `tick` as the planner
   process runs it (with its `StateCache`) refilling 100 slots whose assignments just closed, `tick`
   with no free slot, and the full state read (a cold start, and the cache's periodic refresh).
3. Through Redis: a real redis-server and the real planner worker process (`services.planner.
   entrypoint`, solo pool) on that DB, with a campaign of 1,000 writers. The simulated writers are
   this process: they pop `worker.write` messages from the `write` queue, close the assignments in
   the DB (in batches, one finished attempt each) and report them, as real writers would, but at
   once: one `planner.assignment_done` message per assignment, the batch's messages sent through
   one Redis pipeline (1,000 writers on their own machines send theirs in parallel; one process
   sending them one round trip at a time would measure the bench, not the planner). Reported:
   assignments created per second (see `measure_redis` for the three phases), and the time to
   send a tick's 1,000 `write` messages one by one and through one pipeline.
"""

from __future__ import annotations

import base64
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
from sqlalchemy import func, insert, select, update

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernelswarm.launcher import RedisServer, settings_env, stop_process  # noqa: E402
from services.planner.campaign import create_campaign  # noqa: E402
from services.planner.policy import HEADROOM_UCB, PolicyConfig, ProblemStats, choose  # noqa: E402
from services.planner.state import StateCache, read_state  # noqa: E402
from services.planner.tick import tick  # noqa: E402
from shared.celery_app import ASSIGNMENT_DONE, PLAN_QUEUE, PLAN_TICK, WRITE, WRITE_QUEUE, make_celery  # noqa: E402
from shared.db import AssignmentRow, AttemptRow, CampaignRow, Database, ProblemRow, SolutionRow, utcnow  # noqa: E402
from shared.settings import Settings  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ATTEMPTS_PER_PROBLEM = 5
SEND_QUEUE = "bench.send"  # messages sent only to time the sending


def timed(run, repeat: int) -> dict:
    """Median and spread of `repeat` calls, in ms of wall time; and the median CPU time of this
    process (the VM is shared: wall time moves with the other sessions' load, CPU time less)."""
    samples, cpu = [], []
    for _ in range(repeat):
        started, started_cpu = time.perf_counter(), time.process_time()
        run()
        samples.append((time.perf_counter() - started) * 1e3)
        cpu.append((time.process_time() - started_cpu) * 1e3)
    return summary(samples, cpu)


def summary(samples: list[float], cpu: list[float]) -> dict:
    return {"median_ms": statistics.median(samples), "min_ms": min(samples), "max_ms": max(samples),
            "cpu_median_ms": statistics.median(cpu), "runs": len(samples)}


def synthetic_stats(count: int, rng: random.Random) -> list[ProblemStats]:
    stats = []
    for i in range(count):
        attempts = rng.randint(0, 12)
        gain = sum(rng.random() * 0.3 for _ in range(attempts) if rng.random() < 0.2)
        stats.append(ProblemStats(i, i, attempts=attempts, recent_attempts=attempts, recent_gain=gain, gain=gain,
                                  stall=rng.randint(0, attempts),
                                  best_speedup=1 + rng.random() * 3 if attempts else None,
                                  gpu_s=attempts * rng.uniform(1, 30), tokens=attempts * rng.randint(2000, 40000)))
    return stats


def measure_pure_tick(problems: int) -> dict:
    stats = synthetic_stats(problems, random.Random(0))
    return {f"slots_{slots}": timed(lambda s=slots: choose(HEADROOM_UCB, stats, s, 4, PolicyConfig()), 7)
            for slots in (1, 100, 1000)}


def populate(db: Database, problems: int, rng: random.Random) -> list[int]:
    """`problems` problem rows and ATTEMPTS_PER_PROBLEM finished attempts each, in bulk."""
    with db.session() as session:
        session.execute(insert(ProblemRow), [{"name": f"scale-{i}", "definition_json": "{}", "workloads_jsonl": ""}
                                             for i in range(problems)])
        ids = list(session.scalars(select(ProblemRow.id).order_by(ProblemRow.id)))
    return ids


def add_attempts(db: Database, campaign_id: int, problem_ids: list[int], rng: random.Random) -> int:
    solutions, attempts = [], []
    now = utcnow()
    for problem_id in problem_ids:
        for k in range(ATTEMPTS_PER_PROBLEM):
            digest = f"{problem_id:032x}{k:032x}"
            solutions.append({"hash": digest, "problem_id": problem_id, "name": "s", "author": "bench",
                              "language": "cuda"})
            passed = rng.random() < 0.6
            attempts.append({"id": f"{problem_id}-{k}", "problem_id": problem_id, "solution_hash": digest,
                             "campaign_id": campaign_id, "status": "PASSED" if passed else "COMPILE_ERROR",
                             "device": "cuda", "speedup": rng.uniform(0.5, 4.0) if passed else None,
                             "gpu_seconds": rng.uniform(1, 30), "tokens": rng.randint(2000, 40000),
                             "message": None if passed else "kernel.cu(1): error", "created_at": now,
                             "finished_at": now})
    with db.session() as session:
        session.execute(insert(SolutionRow), solutions)
        session.execute(insert(AttemptRow), attempts)
    return len(attempts)


def measure_db_tick(db: Database, campaign_id: int) -> dict:
    """Ticks as the planner process runs them (with its `StateCache`): each refills 100 slots whose
    assignments just closed with one attempt each, as writers leave them."""
    cache = StateCache()
    created = tick(db, campaign_id, lambda _: None, cache=cache)  # the first tick reads everything
    samples, cpu = [], []
    for _ in range(7):
        close_with_attempts(db, campaign_id, created)
        started, started_cpu = time.perf_counter(), time.process_time()
        created = tick(db, campaign_id, lambda _: None, cache=cache)
        samples.append((time.perf_counter() - started) * 1e3)
        cpu.append((time.process_time() - started_cpu) * 1e3)
        assert len(created) == 100, created

    def read_all() -> None:
        with db.session() as session:
            read_state(session, campaign_id, PolicyConfig())

    return {
        "tick_refilling_100_slots": summary(samples, cpu),
        "tick_no_free_slot": timed(lambda: tick(db, campaign_id, lambda _: None, cache=cache), 20),
        "full_state_read": timed(read_all, 3),  # a cold tick, and the cache's refresh every 60 s
    }


def close_with_attempts(db: Database, campaign_id: int, assignment_ids: list[int]) -> None:
    """What writers leave behind: one finished attempt per assignment, the assignment DONE."""
    now = utcnow()
    with db.session() as session:
        rows = session.execute(select(AssignmentRow.id, AssignmentRow.problem_id)
                               .where(AssignmentRow.id.in_(assignment_ids), AssignmentRow.status == "QUEUED")).all()
        if not rows:
            return
        session.execute(insert(SolutionRow), [{"hash": f"w{a.id:063x}", "problem_id": a.problem_id, "name": "w",
                                               "author": "bench", "language": "cuda"} for a in rows])
        session.execute(insert(AttemptRow), [{
            "id": f"w-{a.id}", "problem_id": a.problem_id, "solution_hash": f"w{a.id:063x}", "campaign_id": campaign_id,
            "assignment_id": a.id, "status": "PASSED", "device": "cuda", "speedup": 1.0 + (a.id % 97) / 50,
            "gpu_seconds": 5.0, "tokens": 10_000, "created_at": now, "finished_at": now} for a in rows])
        session.execute(update(AssignmentRow).where(AssignmentRow.id.in_([a.id for a in rows]))
                        .values(status="DONE", finished_at=now))


def measure_redis(db_url: str, home: Path, campaign_id: int, seconds: float, writers: int) -> dict:
    """The real planner worker on `db_url`; this process plays the writers. Three phases:

    - `reported`: the protocol as built, one `planner.assignment_done` per finished assignment;
    - `coalesced`: one `planner.tick` per batch of finished assignments (what the planner alone
      can hand out when reports do not each cost a message);
    - `celery_floor`: a worker configured like the planner's running a task that does nothing (see
      `celery_floor`).
    """
    server = RedisServer(home / "redis")
    settings = Settings(home=home, database_url=db_url, redis_url=server.url, log_level="WARNING")
    log = open(home / "planner.log", "wb")
    planner = subprocess.Popen([sys.executable, "-m", "celery", "-A", "services.planner.entrypoint", "worker", "-n",
                                "planner@%h", "--without-gossip", "--without-mingle", "-l", settings.log_level, "-Q",
                                "plan", "--pool", "solo"], env=settings_env(settings), cwd=REPO, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    app = make_celery(settings, "simulated-writers")
    app.conf.task_send_sent_event = False  # the writers are not what is measured: keep them cheap
    client = redis.Redis.from_url(server.url)
    db = Database(db_url, upgrade=False)
    try:
        app.send_task(PLAN_TICK, args=[campaign_id])
        wait_for(lambda: created_count(db, campaign_id) >= writers, planner)
        result = {"writers": writers}
        for phase, coalesce in (("reported", False), ("coalesced", True)):
            started, first = time.monotonic(), created_count(db, campaign_id)
            while time.monotonic() - started < seconds:
                serve_writers(client, db, app, campaign_id, coalesce)
            elapsed = time.monotonic() - started
            created = created_count(db, campaign_id) - first
            result[phase] = {"seconds": elapsed, "assignments": created, "assignments_per_s": created / elapsed}
            wait_for(lambda: client.llen(PLAN_QUEUE) == 0, planner)  # let the planner catch up between phases
        result["send_1000"] = measure_send(app, client)
        result["celery_floor"] = celery_floor(settings, home)
        return result
    finally:
        stop_process(planner, 15)
        log.close()
        client.close()
        server.stop()
        db.dispose()


def measure_send(app, client: redis.Redis, count: int = 1000, repeat: int = 6) -> dict:
    """Sending a tick's `count` `worker.write` messages (to a queue nobody reads): one Redis round
    trip per message, as the planner did, against one pipeline per batch, as it does now
    (`services.planner.tasks`: kombu's `Producer.batch`). Alternated, median of `repeat`, in ms."""
    def one_by_one() -> None:
        with app.producer_or_acquire() as producer:
            for i in range(count):
                app.send_task(WRITE, args=[i], queue=SEND_QUEUE, producer=producer)

    def pipelined() -> None:
        with app.producer_or_acquire() as producer, producer.batch(max_size=count):
            for i in range(count):
                app.send_task(WRITE, args=[i], queue=SEND_QUEUE, producer=producer)

    samples: dict[str, list[float]] = {"one_by_one": [], "pipelined": []}
    for _ in range(repeat):
        for name, send in (("one_by_one", one_by_one), ("pipelined", pipelined)):
            started = time.perf_counter()
            send()
            samples[name].append((time.perf_counter() - started) * 1e3)
            client.delete(SEND_QUEUE)
    return {name: {"median_ms": statistics.median(values), "min_ms": min(values), "max_ms": max(values),
                   "messages": count, "runs": repeat} for name, values in samples.items()}


NOOP_APP = """
from shared.celery_app import make_celery
from shared.settings import Settings

app = make_celery(Settings.from_env(), "noop")
app.conf.update(worker_send_task_events=False, task_send_sent_event=False)  # as the planner's


@app.task(name="bench.noop", acks_late=True)
def noop(_: int) -> None:
    return None
"""


def celery_floor(settings: Settings, home: Path, count: int = 3000) -> dict:
    """Messages a second a solo Celery worker configured like the planner consumes when its task does
    nothing: the ceiling of any design with one message per assignment, on this machine, now."""
    (home / "noop_app.py").write_text(NOOP_APP)
    env = settings_env(settings) | {"PYTHONPATH": os.pathsep.join([str(home), str(REPO)])}
    app = make_celery(settings, "noop-sender")
    app.conf.task_send_sent_event = False
    client = redis.Redis.from_url(settings.redis_url)
    with app.producer_or_acquire() as producer:
        for i in range(count):
            app.send_task("bench.noop", args=[i], queue="noop", producer=producer)
    worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "noop_app", "worker", "-Q", "noop", "--pool",
                               "solo", "-l", "WARNING", "--without-gossip", "--without-mingle"], env=env, cwd=home,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: client.llen("noop") < count, worker)
        started, left = time.monotonic(), client.llen("noop")
        wait_for(lambda: client.llen("noop") == 0, worker)
        return {"tasks": left, "tasks_per_s": left / (time.monotonic() - started)}
    finally:
        worker.terminate()
        worker.wait(timeout=15)
        client.close()


def wait_for(condition, planner: subprocess.Popen, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if planner.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the planner worker died or stalled; see planner.log")
        time.sleep(0.05)


def created_count(db: Database, campaign_id: int) -> int:
    with db.session() as session:
        return session.scalar(select(func.count()).select_from(AssignmentRow)
                              .where(AssignmentRow.campaign_id == campaign_id))


def serve_writers(client: redis.Redis, db: Database, app, campaign_id: int, coalesce: bool) -> int:
    """Take every `write` message waiting, do what writers do (`close_with_attempts`, in one
    transaction), then report: each assignment done, or one tick for the batch."""
    first = client.brpop([WRITE_QUEUE], timeout=1)
    if first is None:
        return 0
    raw = [first[1], *(client.rpop(WRITE_QUEUE, 999) or [])]
    ids = sorted({json.loads(base64.b64decode(json.loads(m)["body"]))[0][0] for m in raw})
    close_with_attempts(db, campaign_id, ids)
    with app.producer_or_acquire() as producer, producer.batch():  # 1,000 writers would send at once
        if coalesce:
            app.send_task(PLAN_TICK, args=[campaign_id], producer=producer)
        else:
            for assignment_id in ids:
                app.send_task(ASSIGNMENT_DONE, args=[assignment_id], producer=producer)
    return len(ids)


def measure_scale(problems: int, writers: int, seconds: float) -> dict:
    rng = random.Random(1)
    report = {"problems": problems, "attempts": problems * ATTEMPTS_PER_PROBLEM, "cpus": os.cpu_count(),
              "load_average_before": os.getloadavg(), "pure_tick": measure_pure_tick(problems)}
    with tempfile.TemporaryDirectory(prefix="planner-scale-") as tmp:
        home = Path(tmp)
        db_url = f"sqlite:///{home / 'scale.db'}"
        db = Database(db_url)
        problem_ids = populate(db, problems, rng)
        campaign_id = create_campaign(db, "scale", problem_ids, "cuda", 100, 1)
        add_attempts(db, campaign_id, problem_ids, rng)
        report["db_tick"] = measure_db_tick(db, campaign_id)
        with db.session() as session:  # the same campaign, now with 1,000 writers
            session.execute(update(AssignmentRow).where(AssignmentRow.status == "QUEUED").values(status="DONE"))
            session.execute(update(CampaignRow).where(CampaignRow.id == campaign_id).values(writers=writers))
        db.dispose()
        report["redis"] = measure_redis(db_url, home, campaign_id, seconds, writers)
    report["load_average_after"] = os.getloadavg()
    return report


def print_scale(report: dict) -> None:
    print(f"\nplanner scale: {report['problems']:,} problems, {report['attempts']:,} attempts; load average "
          f"{report['load_average_before'][0]:.1f} before, {report['load_average_after'][0]:.1f} after, "
          f"on {report['cpus']} CPUs")
    for slots, row in report["pure_tick"].items():
        print(f"  pure tick ({slots.replace('_', ' ')}): {row['median_ms']:8.1f} ms median "
              f"({row['cpu_median_ms']:.1f} ms CPU)")
    for name, row in report["db_tick"].items():
        print(f"  DB {name.replace('_', ' ')}: {row['median_ms']:8.1f} ms median ({row['cpu_median_ms']:.1f} ms CPU)")
    redis_row = report["redis"]
    print(f"  through Redis, {redis_row['writers']:,} simulated writers:")
    for phase in ("reported", "coalesced"):
        row = redis_row[phase]
        print(f"    {phase:10} {row['assignments_per_s']:8.0f} assignments/s ({row['assignments']:,} in "
              f"{row['seconds']:.0f} s)")
    send = redis_row["send_1000"]
    print(f"    sending 1,000 write messages: {send['one_by_one']['median_ms']:.0f} ms one by one, "
          f"{send['pipelined']['median_ms']:.0f} ms pipelined")
    print(f"    a Celery worker like the planner's, doing nothing: {redis_row['celery_floor']['tasks_per_s']:.0f} "
          f"tasks/s")


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=10_000)
    parser.add_argument("--writers", type=int, default=1_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    report = measure_scale(args.problems, args.writers, args.seconds)
    print_scale(report)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())

"""The body of `kernelswarm up`: load the problems, start everything, run the campaign, stop cleanly."""

from __future__ import annotations

import signal
import time
from dataclasses import replace
from datetime import datetime

from rich.console import Console
from sqlalchemy import func, or_, select

from kernelswarm.endpoints_watch import EndpointWatch
from kernelswarm.launcher import (CUT_OFF_WAIT_S, GRACE_S, STOP_WAIT_S, Exit, RedisServer, Services, WebServer,
                                  port_is_free)
from services.planner.campaign import add_problems, create_campaign, pause_campaign, resume_campaign, stop_campaign
from services.planner.tick import IDLE, RUNNING, STOPPED
from services.web.tokens import check_submit_token
from shared.celery_app import PLAN_TICK, make_celery
from shared.db import AttemptRow, CampaignRow, Database, ProblemRow, utcnow
from shared.errors import UserError
from shared.leaderboard import leaderboard, render_table
from shared.repository import IN_FLIGHT, VERDICT_KIND, upsert_problem
from shared.schema import Problem, load_problem
from shared.schema.problem import find_problems
from shared.settings import Settings
from shared.sol_bounded import CountLimits, ToCount, count_problems

PROGRESS_EVERY_S = 5.0
LOCAL = "local"  # the name of the campaigns `up` makes begins so
PAUSED_BY_UP = "paused: `kernelswarm up` ended; the next `up` continues it"
IDLE_HELP = ("the writers have nothing left to try there. Submit a problem (the web's form or API, with "
             "KERNELSWARM_SUBMIT_TOKEN set) or set OPENAI_API_KEY for an LLM writer, and it goes on; "
             "`kernelswarm reset` starts afresh. Still serving; Ctrl-C stops")


def run_up(settings: Settings, duration_s: float | None, new_campaign: bool = False) -> int:
    out = Console(stderr=True)
    check_submit_token(settings.submit_token)  # before anything starts: the web would refuse it
    if not port_is_free(settings.web_port):
        raise UserError(f"port {settings.web_port} is in use: pass --port or set KERNELSWARM_WEB_PORT")
    problems = [load_problem(folder) for folder in find_problems([settings.problems_dir])]
    if not problems:
        raise UserError(f"no problems under {settings.problems_dir}")
    if settings.device == "cpu":
        problems, left_out = cpu_sized(problems, replace(CountLimits.from_settings(settings), cpu_budget_bytes=0))
        if left_out:
            out.print(f"on the CPU, leaving out {len(left_out)} problems too large for it: "
                      f"{', '.join(left_out)} (run them with --device cuda)", highlight=False)
        if not problems:
            raise UserError(f"every problem under {settings.problems_dir} is too large for a CPU run")
    redis_server = None
    if not settings.redis_url:
        redis_server = RedisServer(settings.home / "redis")
        settings = settings.model_copy(update={"redis_url": redis_server.url})
    db = Database(settings.db_url)
    with db.session() as session:
        problem_ids = [upsert_problem(session, p).id for p in problems]
    campaign_id, started_line = _campaign_for(db, settings, problem_ids, new_campaign)
    out.print(started_line, highlight=False)
    services = Services(settings, settings.home / "logs", redis=redis_server)
    started_at = utcnow()
    endpoints = EndpointWatch(settings)
    web = None
    stopping = {"signal": False}
    previous = signal.signal(signal.SIGTERM, lambda *_: stopping.update(signal=True))
    try:
        services.start()
        web = WebServer(settings, settings.web_port, services.states, log_path=services.log_of("web"))
        out.print(f"[bold]KernelSwarm[/bold] campaign {campaign_id} over {len(problems)} problems on "
                  f"{settings.device}; web at http://127.0.0.1:{settings.web_port}/ ; logs in "
                  f"{settings.home / 'logs'}; Ctrl-C stops", highlight=False)
        make_celery(settings).send_task(PLAN_TICK, args=[campaign_id])
        _watch(db, campaign_id, services, duration_s, stopping, out, endpoints)
    except KeyboardInterrupt:
        out.print("stopping (Ctrl-C)")
    finally:
        signal.signal(signal.SIGTERM, previous)
        if _state(db, campaign_id)[0] != STOPPED:  # stopped meanwhile (`campaign stop`): it stays so
            pause_campaign(db, campaign_id, PAUSED_BY_UP)
        left = _drain(db, campaign_id, started_at, services, out)
        if left:  # they had their GRACE_S: the workers still busy with them are not waited for again
            out.print(f"stopping with {left} attempt(s) still in flight after {GRACE_S:.0f} s", highlight=False)
        services.stop(wait_s=CUT_OFF_WAIT_S if left else STOP_WAIT_S)
        if web is not None:
            web.stop()
        if redis_server is not None:
            redis_server.stop()
    with db.session() as session:
        console = Console()
        console.print(render_table(leaderboard(session, campaign_id), console.width))
    restarted = [f"{name} {n}" for name, n in services.restart_counts.items() if n]
    if restarted:
        out.print(f"restarts while running: {', '.join(restarted)}", highlight=False)
    return endpoints.exit_code(db, campaign_id, out)  # non-zero when the LLM endpoint refused every write


def _campaign_for(db: Database, settings: Settings, problem_ids: list[int], new: bool) -> tuple[int, str]:
    """The continuous local campaign on this device that an earlier `up` left (RUNNING again, with
    the problems found now joined), or a new one (`new`: the earlier one is stopped first)."""
    with db.session() as session:
        earlier = session.scalars(select(CampaignRow).where(
            CampaignRow.continuous.is_(True), CampaignRow.device == settings.device,
            CampaignRow.status != STOPPED, CampaignRow.name.startswith(LOCAL))
            .order_by(CampaignRow.id.desc())).first()
        earlier_id = earlier.id if earlier is not None else None
    if earlier_id is not None and new:
        stop_campaign(db, earlier_id, "stopped: `kernelswarm up --new` started another")
        earlier_id = None
    if earlier_id is None:
        name = f"{LOCAL} {datetime.now():%Y-%m-%d %H:%M}"
        campaign_id = create_campaign(db, name, problem_ids, settings.device, settings.writers,
                                      settings.attempts_per_assignment, continuous=True)
        return campaign_id, f"campaign {campaign_id} is new ({len(problem_ids)} problems)"
    joined = add_problems(db, earlier_id, problem_ids)
    resume_campaign(db, earlier_id)
    with db.session() as session:
        created = session.get(CampaignRow, earlier_id).created_at
    counts = _counts(db, earlier_id)
    line = (f"continuing campaign {earlier_id} from {created:%Y-%m-%d %H:%M} UTC: "
            f"{counts['finished'] + counts['in_flight']} attempts so far, {counts['PASSED']} passed"
            + (f"; {len(joined)} new problems join it" if joined else "") + " (`kernelswarm up --new` starts a new campaign, `kernelswarm reset` a fresh home)")
    return earlier_id, line


CPU_MAX_FLOPS = 2e10  # per workload: about what two cores do in a few seconds
CPU_MAX_BYTES = 128 << 20  # fp8 and other conversions run far below memory speed on a CPU


def cpu_sized(problems: list[Problem],
              limits: CountLimits = CountLimits(cpu_budget_bytes=0)) -> tuple[list[Problem], list[str]]:
    """The problems every workload of which a CPU evaluates in seconds (work counted from the
    reference, as for SOL, on meta tensors only: `cpu_budget_bytes` 0), and the names of the
    others. The references are untrusted text: all of them are counted in one child in the
    evaluator's sandbox (`SandboxRunner`), never in this process; one that cannot be counted there
    (an error, past the limits) is too large."""
    from services.evaluator.sandbox.counting import SandboxRunner

    counted = count_problems([ToCount(p.definition, tuple(p.workloads), p.root) for p in problems],
                             runner=SandboxRunner(), limits=limits)
    kept, left_out = [], []
    for problem, counts in zip(problems, counted, strict=True):
        small = all(c.work is not None and c.work.total_matrix_flops + c.work.vector_flops <= CPU_MAX_FLOPS
                    and c.work.bytes_moved <= CPU_MAX_BYTES for c in counts)
        (kept if small else left_out).append(problem if small else problem.name)
    return kept, left_out


def _watch(db: Database, campaign_id: int, services: Services, duration_s: float | None,
           stopping: dict, out: Console, endpoints: EndpointWatch | None = None) -> None:
    started = time.monotonic()
    last_report = -PROGRESS_EVERY_S
    said: dict = {"state": (RUNNING, None), "counts": None, "problems": {}}
    while not stopping["signal"]:
        elapsed = time.monotonic() - started
        if duration_s is not None and elapsed >= duration_s:
            return
        _report_exits(services.supervise(), services, out)
        if endpoints is not None and endpoints.poll(elapsed, out):
            return  # a fatal endpoint error paused the campaign: no writer can go on
        if elapsed - last_report >= PROGRESS_EVERY_S:
            last_report = elapsed
            state = _state(db, campaign_id)
            if state != said["state"]:
                said["state"] = state
                _say_state(campaign_id, state, elapsed, out)
            counts = _counts(db, campaign_id)
            if counts != said["counts"]:
                said["counts"] = counts
                out.print(f"[{elapsed:5.0f} s] attempts: {counts['finished']} finished, {counts['PASSED']} passed, "
                          f"{counts['in_flight']} in flight", highlight=False, soft_wrap=True)
            progress = _progress(db, campaign_id)
            for name, line in progress.items():
                if said["problems"].get(name) != line:
                    out.print(f"[{elapsed:5.0f} s] {name}: {line}", highlight=False, soft_wrap=True)
            said["problems"] = progress
        time.sleep(0.5)


def _report_exits(exits: list[Exit], services: Services, out: Console) -> None:
    """One line per process that exited. None stops `up`: one in a crash loop (what an attempt
    that kills its evaluator, or the machine, does to it) is said in red and restarted with backoff."""
    for exit_ in exits:
        colour = "bold red" if exit_.crash_loop else "yellow"
        out.print(f"[{colour}]{exit_.describe()}[/{colour}] (log: {services.log_of(exit_.name)})", highlight=False)


def _counts(db: Database, campaign_id: int) -> dict[str, int]:
    with db.session() as session:
        rows = session.execute(select(AttemptRow.status, func.count()).where(  # evaluations: diagnostics are no verdict
            AttemptRow.campaign_id == campaign_id, AttemptRow.kind == VERDICT_KIND).group_by(AttemptRow.status)).all()
    by_status = dict(rows)
    in_flight = sum(by_status.get(s, 0) for s in IN_FLIGHT)
    return {"finished": sum(by_status.values()) - in_flight, "PASSED": by_status.get("PASSED", 0),
            "in_flight": in_flight}


def _state(db: Database, campaign_id: int) -> tuple[str, str | None]:
    with db.session() as session:
        campaign = session.get(CampaignRow, campaign_id)
        return campaign.status, campaign.status_reason


def _say_state(campaign_id: int, state: tuple[str, str | None], elapsed: float, out: Console) -> None:
    """The campaign's changes of state, said once each: idle (and what would give it work), working
    again, stopped (a budget) while the services keep serving."""
    status, reason = state
    if status == RUNNING and reason and reason.startswith(IDLE):
        out.print(f"[{elapsed:5.0f} s] [bold]campaign {campaign_id} {reason}[/bold]: {IDLE_HELP}", highlight=False)
    elif status == RUNNING:
        out.print(f"[{elapsed:5.0f} s] campaign {campaign_id} is working again", highlight=False)
    else:
        out.print(f"[{elapsed:5.0f} s] [bold]campaign {campaign_id} {status}[/bold]: {reason or 'no reason recorded'}; "
                  "still serving (the web, submitted problems' references); Ctrl-C stops", highlight=False)


def _progress(db: Database, campaign_id: int) -> dict[str, str]:
    """One line per problem of the campaign that has attempts: how many, passed, the best speedup,
    the latest verdict; `up` prints the lines that changed."""
    with db.session() as session:
        rows = session.execute(
            select(ProblemRow.name, AttemptRow.status, AttemptRow.speedup)
            .join(ProblemRow, ProblemRow.id == AttemptRow.problem_id)
            .where(AttemptRow.campaign_id == campaign_id, AttemptRow.kind == VERDICT_KIND)
            .order_by(AttemptRow.created_at, AttemptRow.id)).all()
    by_problem: dict[str, list] = {}
    for row in rows:
        by_problem.setdefault(row.name, []).append(row)
    lines = {}
    for name, attempts in sorted(by_problem.items()):
        finished = [a for a in attempts if a.status not in IN_FLIGHT]
        passed = [a.speedup for a in finished if a.status == "PASSED" and a.speedup is not None]
        best = f", best {max(passed):.2f}x" if passed else ""
        last = f", last {finished[-1].status}" if finished else ""
        flying = len(attempts) - len(finished)
        lines[name] = (f"{len(finished)} attempts, {len(passed)} passed{best}{last}"
                       + (f", {flying} in flight" if flying else ""))
    return lines


def _drain(db: Database, campaign_id: int, since: datetime, services: Services, out: Console) -> int:
    """Let attempts already sent finish (up to GRACE_S), so none is cut off half-way: the campaign's
    and those without a campaign recorded since `since` (a problem submitted on the web). Returns
    how many are still in flight."""
    deadline = time.monotonic() + GRACE_S
    while not services.dead():
        in_flight = _in_flight(db, campaign_id, since)
        if in_flight == 0 or time.monotonic() >= deadline:
            return in_flight
        out.print(f"waiting for {in_flight} attempt(s) in flight", highlight=False)
        time.sleep(2.0)
    return _in_flight(db, campaign_id, since)


def _in_flight(db: Database, campaign_id: int, since: datetime) -> int:
    with db.session() as session:
        return session.scalar(select(func.count()).select_from(AttemptRow).where(
            AttemptRow.status.in_(IN_FLIGHT),
            or_(AttemptRow.campaign_id == campaign_id,
                AttemptRow.campaign_id.is_(None) & (AttemptRow.created_at >= since))))

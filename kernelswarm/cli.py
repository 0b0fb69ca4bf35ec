"""The `kernelswarm` command."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kernelswarm.arguments import count, db_id, mebibytes, port, positive_seconds, writable_file
from shared.errors import KernelSwarmError
from shared.home import secure_home
from shared.logs import configure_logging
from shared.schema import load_problem, load_solution, missing_data_files, oversized
from shared.schema.problem import find_problems
from shared.settings import Settings

err = Console(stderr=True)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "handler"):
        parser.print_help()
        return 2
    try:
        secure_home(Settings.from_env(), create=False)  # a home found open to others: 0700 (shared/home.py)
        return args.handler(args)
    except KernelSwarmError as error:
        err.print(f"[red]error:[/red] {error}", highlight=False, markup=True)
        return 2
    except KeyboardInterrupt:
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kernelswarm", description="A swarm of agents that makes GPU kernels faster.")
    commands = parser.add_subparsers(metavar="COMMAND")

    p = command(commands, "eval", "evaluate a solution on a problem, without any queue",
                "kernelswarm eval problems/llama31_8b_rmsnorm "
                "--solution problems/llama31_8b_rmsnorm/solutions/pytorch_seed.json --max-workloads 3")
    p.add_argument("problem_dir", type=Path, metavar="PROBLEM_DIR",
                   help="the problem's folder (definition.json, workload.jsonl)")
    p.add_argument("--solution", type=Path, required=True, metavar="FILE",
                   help="the solution to evaluate: a SOL-ExecBench Solution JSON file")
    p.add_argument("--device", default=None, help="cpu or cuda (default: KERNELSWARM_DEVICE or cpu)")
    p.add_argument("--max-workloads", type=count, default=None, metavar="N",
                   help="evaluate only the problem's first N workloads (default: all)")
    p.add_argument("--json", action="store_true", help="print the traces as JSONL on stdout")
    p.add_argument("-o", "--output", type=Path, default=None, metavar="FILE", help="write the traces as JSONL to FILE")
    p.set_defaults(handler=cmd_eval)

    p = command(commands, "sol", "the speed of light (T_sol) of each workload of a problem; runs no kernel",
                "kernelswarm sol problems/llama31_8b_gemm_o_proj --hardware 'NVIDIA H100 80GB HBM3' --json")
    p.add_argument("problem_dir", type=Path, metavar="PROBLEM_DIR",
                   help="the problem's folder (definition.json, workload.jsonl)")
    p.add_argument("--hardware", default="H200 SXM", metavar="NAME",
                   help="a GPU of shared/hardware.py: a row key or name, or torch's device name (default: H200 SXM)")
    p.add_argument("--mode", choices=["physical", "solar"], default="physical",
                   help="physical: the work and bytes a kernel must do at each tensor's real size (default); "
                        "solar: SOL-ExecBench's published conventions, for comparing with their figures")
    p.add_argument("--calibration", type=Path, default=None, metavar="FILE",
                   help="measured ceilings (services.evaluator.calibrate's JSON); T_sol takes the faster of "
                        "each and the datasheet's")
    p.add_argument("--json", action="store_true", help="print each workload's figures as JSON on stdout")
    p.add_argument("--memory-mb", type=mebibytes, default=None, metavar="MIB",
                   help="the counting child's address-space limit (default: KERNELSWARM_SOL_COUNT_MEMORY_MB or 6144); "
                        "a workload that needs more gets T_sol unknown")
    p.add_argument("--time-s", type=positive_seconds, default=None, metavar="S",
                   help="the counting time per workload (default: KERNELSWARM_SOL_COUNT_TIME_S or 120)")
    p.set_defaults(handler=cmd_sol)

    problems = command(commands, "problems", "list, validate or import problems").add_subparsers(metavar="ACTION")
    p = command(problems, "list", "the problems under KERNELSWARM_PROBLEMS_DIR (default problems/)")
    p.add_argument("--json", action="store_true", help="print the problems as a JSON list on stdout")
    p.set_defaults(handler=cmd_problems_list)
    p = command(problems, "validate", "load problem folders and check them; runs nothing",
                "kernelswarm problems validate problems/ ../shared/sol-execbench-sample/L1/*")
    p.add_argument("paths", type=Path, nargs="+", metavar="PATH",
                   help="a problem folder, or a folder with problem folders below it")
    p.set_defaults(handler=cmd_problems_validate)
    p = command(problems, "import", "register every problem found under the folders, by its definition's name, "
                "for campaigns; optionally create a campaign over them",
                "kernelswarm problems import ../shared/sol-execbench-sample --campaign 'SOL-ExecBench sample'")
    p.add_argument("paths", type=Path, nargs="+", metavar="DIR",
                   help="a problem folder, or a folder with problem folders below it (searched recursively)")
    p.add_argument("--campaign", default=None, metavar="NAME",
                   help="also create a RUNNING campaign of this name over the problems registered")
    p.add_argument("--device", default=None, help="the campaign's device: cpu or cuda (default: KERNELSWARM_DEVICE or cpu)")
    p.add_argument("--json", action="store_true", help="print what was registered (and refused, and why) as JSON")
    p.set_defaults(handler=cmd_problems_import)

    p = command(commands, "up", "start Redis, planner, writers, evaluator and web; run the default campaign",
                "kernelswarm up --device cpu --duration 60")
    p.add_argument("--device", default=None, help="cpu or cuda (default: KERNELSWARM_DEVICE or cpu)")
    p.add_argument("--duration", type=positive_seconds, default=None, metavar="S",
                   help="stop after S seconds (default: run until Ctrl-C)")
    p.add_argument("--port", type=port, default=None, help="the web's port (default: KERNELSWARM_WEB_PORT or 8000)")
    p.add_argument("--new", action="store_true",
                   help="start a new campaign (default: continue the one an earlier `up` on this device left)")
    p.set_defaults(handler=cmd_up)

    p = command(commands, "reset", "delete the local home (DB, store, logs): the next `up` starts afresh",
                "kernelswarm reset --yes")
    p.add_argument("--yes", action="store_true", help="delete without asking (required when stdin is not a terminal)")
    p.set_defaults(handler=cmd_reset)

    p = command(commands, "token", "print a new random submit token (for KERNELSWARM_SUBMIT_TOKEN)",
                "export KERNELSWARM_SUBMIT_TOKEN=$(kernelswarm token)")
    p.set_defaults(handler=cmd_token)

    p = command(commands, "leaderboard", "the current leaderboard from the DB", "kernelswarm leaderboard --campaign 1")
    p.add_argument("--json", action="store_true", help="print it as JSON on stdout (what /api/leaderboard serves)")
    p.add_argument("--campaign", type=db_id, default=None, metavar="ID",
                   help="only the campaign's problems, counting only its attempts (default: every problem)")
    p.set_defaults(handler=cmd_leaderboard)
    add_campaign_commands(commands)
    return parser


def command(commands, name: str, summary: str, example: str | None = None) -> argparse.ArgumentParser:
    """A subcommand whose one-line `summary` is its line in its parent's help and the start of its
    own, which ends with the example when there is one."""
    return commands.add_parser(name, help=summary, description=summary,
                               epilog=f"example:\n  {example}" if example else None,
                               formatter_class=argparse.RawDescriptionHelpFormatter)


def add_campaign_commands(commands) -> None:
    from services.planner.policy import DEFAULT_POLICY, POLICIES

    campaigns = command(commands, "campaign", "create, list, pause, resume or stop campaigns").add_subparsers(
        metavar="ACTION")
    p = command(campaigns, "create", "a campaign over problems (default: every problem in the library)",
                "kernelswarm campaign create llama31_8b_rmsnorm llama31_8b_swiglu --writers 4 --budget-gpu-s 3600")
    p.add_argument("problems", nargs="*", metavar="PROBLEM", help="problem names (library or submitted)")
    p.add_argument("--name", default=None,
                   help="the campaign's name (default: campaign YYYY-MM-DD HH:MM, when it is created)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: KERNELSWARM_DEVICE or cpu)")
    p.add_argument("--writers", type=count, default=None, metavar="N",
                   help="assignments in flight at once (default: KERNELSWARM_WRITERS or 3)")
    p.add_argument("--attempts-per-assignment", type=count, default=None, metavar="N",
                   help="attempts a writer makes per assignment (default: KERNELSWARM_ATTEMPTS_PER_ASSIGNMENT or 4)")
    p.add_argument("--policy", choices=POLICIES, default=DEFAULT_POLICY,
                   help=f"how the planner picks problems (default: {DEFAULT_POLICY}; see docs/planner.md)")
    p.add_argument("--budget-attempts", type=count, default=None, metavar="N",
                   help="at most N attempts in all (default: no limit)")
    p.add_argument("--budget-gpu-s", type=positive_seconds, default=None, metavar="S",
                   help="stop once the finished attempts took S GPU-seconds (default: no limit)")
    p.add_argument("--budget-tokens", type=count, default=None, metavar="N",
                   help="stop once the finished attempts spent N LLM tokens (default: no limit)")
    p.add_argument("--budget-wall-s", type=positive_seconds, default=None, metavar="S",
                   help="stop S seconds after the campaign was created, paused time included (default: no limit)")
    p.set_defaults(handler=cmd_campaign_create)
    p = command(campaigns, "list", "campaigns with what they spent against their budgets")
    p.add_argument("--json", action="store_true", help="print the campaigns as a JSON list on stdout")
    p.set_defaults(handler=cmd_campaign_list)
    for action, help_text in (("pause", "no new assignments; writers end theirs after the attempt in hand"),
                              ("resume", "running again (ticks the planner when KERNELSWARM_REDIS_URL is set)"),
                              ("stop", "stop for good")):
        p = command(campaigns, action, help_text, f"kernelswarm campaign {action} 1")
        p.add_argument("campaign_id", type=db_id, metavar="ID", help="the campaign's id (`kernelswarm campaign list`)")
        p.set_defaults(handler=cmd_campaign_control, action=action)


def cmd_eval(args: argparse.Namespace) -> int:
    from services.evaluator.config import EvalConfig
    from shared.store import open_store

    settings = Settings.from_env(device=args.device)
    _use_sandbox_settings(settings)
    problem = load_problem(args.problem_dir, with_seeds=False)
    solution = load_solution(args.solution)
    if args.output is not None and (why := writable_file(args.output)) is not None:
        raise_user(f"-o {args.output}: {why}")  # before the evaluation, not after it
    with err.status("evaluating") as status:
        config = EvalConfig.from_settings(settings, build_cache=open_store(settings))
        status.update(f"{solution.name}: starting the evaluator's children")
        spares = _started_children(config, problem, solution)
        try:
            from services.evaluator.evaluate import evaluate  # torch: imported while the children start

            on_gpu = config.device.startswith("cuda")
            workloads = problem.workloads[:args.max_workloads] if args.max_workloads else problem.workloads
            if on_gpu:  # T_sol's counts (a bounded child of their own), beside everything else from now on
                from services.evaluator.score import count_ahead

                count_ahead(problem.definition, workloads, problem.root)
            baselines = _BaselineCache(settings, problem, config.device) if on_gpu else None
            measure_compile = baselines is not None and baselines.missing(workloads)
            config = dataclasses.replace(config, measure_compile=measure_compile, spares=spares,
                                         compile_baselines=baselines.cached if baselines else config.compile_baselines)
            result = evaluate(problem, solution, config, args.max_workloads,
                              progress=lambda message: status.update(f"{solution.name}: {message}"))
        finally:
            spares.close()
        if baselines is not None:
            baselines.store(result.compile_ms)
    err.print(_traces_table(problem.name, solution.name, result))
    if args.output:
        try:
            args.output.write_bytes(result.traces_jsonl())
        except OSError as error:  # checked before the evaluation; changed meanwhile
            raise_user(f"-o {args.output}: {error.strerror or error}")
    if args.json:
        sys.stdout.write(result.traces_jsonl().decode())
    return 0 if result.status.value == "PASSED" else 1


def _started_children(config, problem, solution):
    """The attempt's children (reference, candidate, and the `cuda` timer), started at once and
    together in a thread, so that the fork server's imports and the children's GPU contexts overlap
    this process's own imports and context, the build and each other instead of coming one after
    another (a one-shot pool: nothing replaces a child taken)."""
    from services.evaluator.scratch import scratch_root
    from services.evaluator.spares import Spares, reference_ids, spare_homes
    from shared.schema import Language

    spares = Spares(config.device, scratch_root(config), config.fork_server, replace=False)
    timer = solution.spec.language is Language.CUDA and config.replay
    spares.start_ahead(spare_homes(problem.root, timer, reference_ids(problem.root)))
    return spares


class _BaselineCache:
    """The reference's torch.compile time per workload on this GPU kind, kept in the home's DB (the
    `baselines` table the evaluators fill) so that a second `eval` of the problem does not compile
    and time the reference again. Keyed by problem name, workload uuid and GPU name."""

    def __init__(self, settings: Settings, problem, device: str) -> None:
        from services.evaluator.evaluate import environment
        from services.evaluator.record import compile_baselines
        from shared.db import Database
        from shared.repository import upsert_problem

        self.db, self.hardware = Database(settings.db_url), environment(device).hardware
        with self.db.session() as session:
            self.problem_id = upsert_problem(session, problem).id
        self.cached = compile_baselines(self.db, self.problem_id, self.hardware)
        self.source = settings.db_url

    def missing(self, workloads) -> bool:
        """Whether the reference's torch.compile must be timed (some of `workloads` has no cached
        time), saying on stderr which it is."""
        missing = [w.uuid for w in workloads if w.uuid not in self.cached]
        if not missing:
            err.print(f"torch.compile baselines of the {len(workloads)} workloads from {self.source} "
                      f"({self.hardware}): not measured again", highlight=False)
        elif len(missing) < len(workloads):
            err.print(f"torch.compile baselines: {len(workloads) - len(missing)} of {len(workloads)} workloads "
                      f"cached in {self.source} ({self.hardware}); timing the reference compiled on all of them",
                      highlight=False)
        return bool(missing)

    def store(self, measured: dict) -> None:
        from services.evaluator.record import store_compile_baselines

        store_compile_baselines(self.db, self.problem_id, self.hardware, measured, self.cached)
        self.db.dispose()


def _traces_table(problem: str, solution: str, result, width: int | None = None) -> Table:
    """One row per workload: latency and reference as median [q1–q3] over the timed runs, the speedup
    only where those intervals do not overlap (else ≈1x). Below 120 columns the axes and T_sol are
    left out (`--json` has everything) and the detail folds."""
    from shared.spread import latency_text, reference_text, speedup_text

    wide = (width or err.width) >= 120
    table = Table(title=f"{solution} on {problem}: {result.status.value}")
    columns = ["workload", *(["axes"] if wide else []), "status", "latency ms", "reference ms", "speedup",
               *(["T_sol ms"] if wide else []), "SOL", "detail"]
    for column in columns:
        table.add_column(column, overflow="fold", min_width={"detail": 6, "latency ms": 15, "reference ms": 15}.get(column))
    for trace in result.traces:
        evaluation, perf, sol = trace.evaluation, trace.evaluation.performance, trace.evaluation.sol
        cells = {"workload": trace.workload.uuid[:8], "axes": json.dumps(trace.workload.axes),
                 "status": evaluation.status.value, "latency ms": latency_text(trace).replace(" [", "\n[") if perf else "",
                 "reference ms": reference_text(trace).replace(" [", "\n[") if perf else "", "speedup": speedup_text(trace) if perf else "",
                 "T_sol ms": f"{sol.t_sol_ms:.4f}" if sol else "", "SOL": f"{sol.score:.2f}" if sol else "",
                 "detail": evaluation.log.strip().splitlines()[-1][:160] if evaluation.log.strip() else ""}
        table.add_row(*(cells[c] for c in columns))
    return table


def cmd_problems_list(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    rows = []
    for folder in find_problems([settings.problems_dir]):
        problem = load_problem(folder)
        rows.append({"name": problem.name, "op_type": problem.definition.op_type, "path": str(folder),
                     "workloads": len(problem.workloads), "seeds": len(problem.seeds),
                     "description": problem.definition.description})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = Table(title=f"problems in {settings.problems_dir}")
    for column in ("name", "op type", "workloads", "seeds", "description"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(row["name"], row["op_type"] or "", str(row["workloads"]), str(row["seeds"]),
                      (row["description"] or "")[:80])
    Console().print(table)
    return 0


def cmd_problems_validate(args: argparse.Namespace) -> int:
    folders, failures = [], 0
    max_bytes = Settings.from_env().max_workload_bytes
    for path in args.paths:
        if path.is_dir() and not (path / "definition.json").exists() and not any(path.rglob("definition.json")):
            err.print(f"[red]FAIL[/red] {path}: no definition.json", highlight=False)
            failures += 1
            continue
        folders.extend(find_problems([path]) if path.exists() else [path])
    for folder in folders:
        try:
            problem = load_problem(folder)
        except KernelSwarmError as error:
            failures += 1
            err.print(f"[red]FAIL[/red] {folder}\n{error}", highlight=False)
            continue
        errors = missing_data_files(problem) + oversized(problem, max_bytes)
        if errors:
            failures += 1
            err.print(f"[red]FAIL[/red] {folder}\n" + "\n".join(errors), highlight=False)
            continue
        err.print(f"[green]ok[/green]   {problem.name}: {len(problem.workloads)} workloads, "
                  f"{len(problem.seeds)} seed solutions", highlight=False)
    err.print(f"{len(folders) - failures} of {len(folders)} problems valid" if folders else "no problems found")
    return 1 if failures or not folders else 0


def cmd_problems_import(args: argparse.Namespace) -> int:
    """Register (insert or update by name) every problem under the paths that loads and has its data
    files; the others are listed with the reason and make the exit status 1."""
    from services.planner.campaign import create_campaign
    from shared.db import Database
    from shared.repository import upsert_problem

    settings = Settings.from_env(device=args.device)
    folders = []
    for path in args.paths:
        found = find_problems([path]) if path.is_dir() else []
        if not found:
            raise_user(f"{path}: no definition.json at or below it")
        folders.extend(found)
    problems, refused = [], {}
    for folder in folders:
        try:
            problem = load_problem(folder, with_seeds=False)
        except KernelSwarmError as error:
            refused[str(folder)] = str(error)
            continue
        missing = missing_data_files(problem) + oversized(problem, settings.max_workload_bytes)
        if missing:
            refused[str(folder)] = missing[0] + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        else:
            problems.append(problem)
    names = [p.name for p in problems]
    if len(set(names)) < len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise_user(f"two folders define the same problem name: {', '.join(twice)}")
    db = Database(settings.db_url)
    with db.session() as session:
        ids = [upsert_problem(session, problem).id for problem in problems]
    campaign_id = None
    if args.campaign and ids:
        campaign_id = create_campaign(db, args.campaign, ids, settings.device, settings.writers,
                                      settings.attempts_per_assignment)
    if args.json:
        print(json.dumps({"registered": names, "refused": refused, "campaign": campaign_id}, indent=2))
    else:
        for folder, reason in refused.items():
            err.print(f"[red]not registered[/red] {folder}: {reason}", highlight=False)
        err.print(f"{len(names)} of {len(folders)} problems registered"
                  + (f"; campaign {campaign_id} created over them ({_kick(settings, campaign_id, 'starts')})"
                     if campaign_id is not None else ""), highlight=False)
        for name in names:
            print(name)
    return 1 if refused or not names else 0


def cmd_sol(args: argparse.Namespace) -> int:
    from services.evaluator.sandbox.counting import SandboxRunner
    from shared.sol import SolMode, hardware_for, report
    from shared.sol_bounded import CountLimits

    settings = Settings.from_env(sol_count_memory_mb=args.memory_mb, sol_count_time_s=args.time_s)
    _use_sandbox_settings(settings)
    mode = SolMode.OURS if args.mode == "physical" else SolMode.SOLAR
    if not (args.problem_dir / "definition.json").is_file():
        raise_user(f"{args.problem_dir}: no definition.json (a problem's folder holds definition.json and workload.jsonl)")
    try:
        hardware = hardware_for(args.hardware, mode, args.calibration)
    except (KeyError, ValueError) as error:
        raise_user(str(error.args[0]) if error.args else str(error))
    print(report(args.problem_dir, hardware, mode, args.json, CountLimits.from_settings(settings),
                 runner=SandboxRunner()))
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from kernelswarm.up import run_up

    settings = Settings.from_env(device=args.device, web_port=args.port)
    _use_sandbox_settings(settings)  # `up` counts its problems' sizes in a sandboxed child itself
    configure_logging("WARNING")
    return run_up(settings, args.duration, args.new)


def cmd_reset(args: argparse.Namespace) -> int:
    """Delete `home` (SQLite DB, file store, logs, the local Redis's files). A DB or store elsewhere
    (KERNELSWARM_DATABASE_URL, KERNELSWARM_STORE_URL) is not touched, and is named."""
    import shutil

    from kombu.utils.url import maybe_sanitize_url

    from kernelswarm.launcher import port_is_free

    settings = Settings.from_env()
    home = settings.home.resolve()
    kept = [f"{what} at {maybe_sanitize_url(url)}" for what, url in
            (("the DB", settings.database_url), ("the store", settings.store_url)) if url]
    if not port_is_free(settings.web_port):
        raise_user(f"port {settings.web_port} is in use: stop `kernelswarm up` first (Ctrl-C), then reset")
    if not home.exists():
        err.print(f"nothing to reset: {home} does not exist", highlight=False)
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            raise_user(f"reset deletes {home}; pass --yes to confirm")
        if input(f"delete {home} and everything in it? [y/N] ").strip().lower() not in ("y", "yes"):
            err.print("nothing deleted", highlight=False)
            return 1
    shutil.rmtree(home)
    err.print(f"deleted {home}" + (f"; not touched: {', '.join(kept)}" if kept else ""), highlight=False)
    return 0


def cmd_token(_args: argparse.Namespace) -> int:
    """The token on stdout (nothing else there, for `$(kernelswarm token)`), what to do with it on stderr."""
    from services.web.tokens import new_token

    print(new_token())
    err.print("set it as KERNELSWARM_SUBMIT_TOKEN for the web (`.env` under docker compose) and give it to "
              "whoever may submit problems and pause campaigns; the web refuses tokens shorter than 32 "
              "characters or not random", highlight=False)
    return 0


def cmd_leaderboard(args: argparse.Namespace) -> int:
    from shared.db import Database
    from shared.leaderboard import leaderboard, render_table

    settings = Settings.from_env()
    db = Database(settings.db_url)
    with db.session() as session:
        board = leaderboard(session, args.campaign)
    if args.json:
        print(board.model_dump_json(indent=2))
    else:
        console = Console()
        console.print(render_table(board, console.width))
    return 0


def cmd_campaign_create(args: argparse.Namespace) -> int:
    from datetime import datetime

    from services.planner.campaign import Budgets, create_campaign
    from shared.db import Database

    settings = Settings.from_env(device=args.device)
    db = Database(settings.db_url)
    problem_ids = _campaign_problems(db, settings, args.problems)
    writers = args.writers if args.writers is not None else settings.writers
    per_assignment = (args.attempts_per_assignment if args.attempts_per_assignment is not None
                      else settings.attempts_per_assignment)
    budgets = Budgets(args.budget_attempts, args.budget_gpu_s, args.budget_tokens, args.budget_wall_s)
    name = args.name or f"campaign {datetime.now():%Y-%m-%d %H:%M}"
    campaign_id = create_campaign(db, name, problem_ids, settings.device, writers, per_assignment,
                                  policy=args.policy, budgets=budgets)
    err.print(f"campaign {campaign_id} created: {len(problem_ids)} problems, {writers} writers, policy "
              f"{args.policy}; {_kick(settings, campaign_id, 'starts')}", highlight=False)
    print(campaign_id)
    return 0


def _campaign_problems(db, settings: Settings, names: list[str]) -> list[int]:
    """Load the library into the DB (as `up` does), then the named problems' ids, in order."""
    from shared.repository import problem_by_name, upsert_problem

    library = [load_problem(folder) for folder in find_problems([settings.problems_dir])] \
        if settings.problems_dir.is_dir() else []
    with db.session() as session:
        for problem in library:
            upsert_problem(session, problem)
        if not names:
            if not library:
                raise_user(f"no problems under {settings.problems_dir}: name the problems to run")
            return [problem_by_name(session, p.name).id for p in library]
        return [problem_by_name(session, name).id for name in names]


def _kick(settings: Settings, campaign_id: int, verb: str) -> str:
    """Tick the planner through Redis when one is configured; say when the campaign will move."""
    if not settings.redis_url:
        return (f"it {verb} at the next `kernelswarm up` (its planner ticks every running campaign when it "
                "starts); set KERNELSWARM_REDIS_URL to reach a running swarm")
    from kombu.exceptions import OperationalError
    from kombu.utils.url import maybe_sanitize_url  # Celery's own: the password as **

    from shared.celery_app import PLAN_TICK, make_celery

    try:
        make_celery(settings).send_task(PLAN_TICK, args=[campaign_id], retry=True,
                                        retry_policy={"max_retries": 2, "interval_start": 0.2})
    except OperationalError as error:
        raise_user(f"the campaign is RUNNING in the DB, but Redis at {maybe_sanitize_url(settings.redis_url)} "
                   f"did not take the tick ({error}); the planner picks it up at its next sweep")
    return f"planner.tick sent through {maybe_sanitize_url(settings.redis_url)}"


def cmd_campaign_list(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from services.planner.campaign import list_campaigns
    from shared.db import Database

    summaries = list_campaigns(Database(Settings.from_env().db_url))
    if args.json:
        print(json.dumps([asdict(s) for s in summaries], indent=2, default=str))
        return 0
    console = Console()
    wide = console.width >= 120  # below, the policy, writers, budgets and creation time are left out (--json)
    columns = ["id", "name", "status", *(["policy"] if wide else []), "device", *(["writers"] if wide else []),
               "problems", "active", "attempts", *(["GPU s", "tokens", "wall", "created"] if wide else [])]
    table = Table(title="campaigns")
    for column in columns:
        table.add_column(column, overflow="fold")
    for s in summaries:
        status = s.status + (f" ({s.status_reason})" if s.status_reason and not wide else "")
        cells = {"id": str(s.id), "name": s.name, "status": status, "policy": s.policy, "device": s.device,
                 "writers": str(s.writers), "problems": str(s.problems), "active": str(s.active_assignments),
                 "attempts": _of(s.attempts, s.budgets.attempts), "GPU s": _of(s.gpu_s, s.budgets.gpu_s),
                 "tokens": _of(s.tokens, s.budgets.tokens), "wall": _of(None, s.budgets.wall_s),
                 "created": f"{s.created_at:%Y-%m-%d %H:%M}"}
        table.add_row(*(cells[c] for c in columns))
    console.print(table)
    for s in summaries:
        if s.status_reason and wide:
            console.print(f"campaign {s.id}: {s.status_reason}", highlight=False)
    return 0


def _of(spent: float | None, budget: float | None) -> str:
    shown = "" if spent is None else (f"{spent:.1f}" if isinstance(spent, float) else str(spent))
    if budget is None:
        return shown or "-"
    limit = f"{budget:g}"
    return f"{shown} / {limit}" if shown else f"{limit} s"


def cmd_campaign_control(args: argparse.Namespace) -> int:
    from services.planner.campaign import pause_campaign, resume_campaign, stop_campaign
    from shared.db import Database

    settings = Settings.from_env()
    db = Database(settings.db_url)
    change = {"pause": pause_campaign, "resume": resume_campaign, "stop": stop_campaign}[args.action]
    status = change(db, args.campaign_id)
    message = {"pause": "no new assignments; writers end theirs after the attempt in hand",
               "stop": "writers end their assignments after the attempt in hand"}.get(args.action)
    if args.action == "resume":
        message = _kick(settings, args.campaign_id, "resumes")
    err.print(f"campaign {args.campaign_id} {status}: {message}", highlight=False)
    return 0


def _use_sandbox_settings(settings: Settings) -> None:
    """The sandbox of the children this process starts (evaluation, SOL counting) takes the
    settings' reference uid and keeps their home, DB, store and logs out of every child's view
    (`sandbox.hidden`)."""
    from services.evaluator.sandbox import hidden
    from services.evaluator.sandbox.isolation import use_reference_uid

    use_reference_uid(settings.reference_uid)
    hidden.hide(hidden.swarm_data(settings))


def raise_user(message: str) -> None:
    from shared.errors import UserError

    raise UserError(message)


if __name__ == "__main__":
    sys.exit(main())

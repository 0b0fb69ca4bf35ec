"""The `kernelswarm` command."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from shared.errors import KernelSwarmError
from shared.logs import configure_logging
from shared.schema import load_problem, load_solution
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
        return args.handler(args)
    except KernelSwarmError as error:
        err.print(f"[red]error:[/red] {error}", highlight=False, markup=True)
        return 2
    except KeyboardInterrupt:
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kernelswarm", description="A swarm of agents that makes GPU kernels faster.")
    commands = parser.add_subparsers(metavar="COMMAND")

    p = commands.add_parser("eval", help="evaluate a solution on a problem, without any queue")
    p.add_argument("problem_dir", type=Path)
    p.add_argument("--solution", type=Path, required=True, help="solution.json")
    p.add_argument("--device", default=None, help="cpu or cuda (default: KERNELSWARM_DEVICE or cpu)")
    p.add_argument("--max-workloads", type=int, default=None, metavar="N")
    p.add_argument("--json", action="store_true", help="print the traces as JSONL on stdout")
    p.add_argument("-o", "--output", type=Path, default=None, help="write the traces as JSONL to FILE")
    p.set_defaults(handler=cmd_eval)

    problems = commands.add_parser("problems", help="list or validate problems").add_subparsers(metavar="ACTION")
    p = problems.add_parser("list", help="the problems under KERNELSWARM_PROBLEMS_DIR (default problems/)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_problems_list)
    p = problems.add_parser("validate", help="load problem folders and check them; runs nothing")
    p.add_argument("paths", type=Path, nargs="+")
    p.set_defaults(handler=cmd_problems_validate)

    p = commands.add_parser("up", help="start Redis, planner, writers, evaluator and web; run the default campaign")
    p.add_argument("--device", default=None, help="cpu or cuda")
    p.add_argument("--duration", type=float, default=None, metavar="S", help="stop after S seconds")
    p.add_argument("--port", type=int, default=None, help="web port (default 8000)")
    p.set_defaults(handler=cmd_up)

    p = commands.add_parser("leaderboard", help="the current leaderboard from the DB")
    p.add_argument("--json", action="store_true")
    p.add_argument("--campaign", type=int, default=None)
    p.set_defaults(handler=cmd_leaderboard)
    return parser


def cmd_eval(args: argparse.Namespace) -> int:
    from services.evaluator.evaluate import EvalConfig, evaluate
    from shared.store import open_store

    settings = Settings.from_env(device=args.device)
    problem = load_problem(args.problem_dir, with_seeds=False)
    solution = load_solution(args.solution)
    if args.max_workloads is not None and args.max_workloads < 1:
        raise_user("--max-workloads must be at least 1")
    with err.status("evaluating") as status:
        config = EvalConfig.from_settings(settings, build_cache=open_store(settings))
        result = evaluate(problem, solution, config, args.max_workloads,
                          progress=lambda message: status.update(f"{solution.name}: {message}"))
    err.print(_traces_table(problem.name, solution.name, result))
    if args.output:
        args.output.write_bytes(result.traces_jsonl())
    if args.json:
        sys.stdout.write(result.traces_jsonl().decode())
    return 0 if result.status.value == "PASSED" else 1


def _traces_table(problem: str, solution: str, result) -> Table:
    table = Table(title=f"{solution} on {problem}: {result.status.value}")
    for column in ("workload", "axes", "status", "latency ms", "reference ms", "speedup", "detail"):
        table.add_column(column, overflow="fold")
    for trace in result.traces:
        evaluation, perf = trace.evaluation, trace.evaluation.performance
        table.add_row(trace.workload.uuid[:8], json.dumps(trace.workload.axes), evaluation.status.value,
                      f"{perf.latency_ms:.4f}" if perf else "", f"{perf.reference_latency_ms:.4f}" if perf else "",
                      f"{perf.speedup_factor:.2f}x" if perf else "", evaluation.log.strip().splitlines()[-1][:160]
                      if evaluation.log.strip() else "")
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
        err.print(f"[green]ok[/green]   {problem.name}: {len(problem.workloads)} workloads, "
                  f"{len(problem.seeds)} seed solutions", highlight=False)
    err.print(f"{len(folders) - failures} of {len(folders)} problems valid" if folders else "no problems found")
    return 1 if failures or not folders else 0


def cmd_up(args: argparse.Namespace) -> int:
    from kernelswarm.up import run_up

    settings = Settings.from_env(device=args.device, web_port=args.port)
    configure_logging("WARNING")
    return run_up(settings, args.duration)


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
        Console().print(render_table(board))
    return 0


def raise_user(message: str) -> None:
    from shared.errors import UserError

    raise UserError(message)


if __name__ == "__main__":
    sys.exit(main())

"""One attempt: build -> reference child -> candidate child, checked by the reference's process ->
one Trace per workload.

The input sets of a workload of random and scalar inputs reach the candidate as each set's seed
(with the digest the reference took of it), and the candidate makes them again; other workloads'
sets go through files in the attempt folder. The expected outputs never leave the reference's
process, which stays on as the attempt's checker (`checker`); the candidate's outputs reach it in
GPU memory (`gpu_handover`) or through files, and only verdicts come back here.
Where the outer clock is on (`EvalConfig.outer_clock`), this process also times each child's timed
batch per workload on its own clock and hands the timed sets over only when that window opens
(`outer_clock`, `children`)."""

from __future__ import annotations

import dataclasses
import importlib
import logging
import math
import os
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from services.evaluator.sandbox import memcap
from services.evaluator.languages.build import Build, build_solution
from services.evaluator.harness.checks import reference_failed, timed_runs
from services.evaluator.children import run_child
from services.evaluator.config import EvalConfig
from services.evaluator.harness.correctness import Check
from services.evaluator.harness.inputs import NOT_REPRODUCED
from services.evaluator.languages.nvcc import arch_for
from services.evaluator.outer_clock import move_timed_sets, timed_hand_over
from services.evaluator.retime import Retimer
from services.evaluator.protocol import EVALUATOR_FAULT, CandidateJob, ReferenceJob, is_fault
from services.evaluator.sandbox.isolation import (
    StartedChild, memory_limit, own_pid_namespace, shared_folders, start_child,
)
from services.evaluator.spares import (
    CONFINED, HOMES, OUTPUTS, REF_INPUTS, REF_TIMED, SPARE_READY_S, Spare, discard, reference_ids, spare_homes,
)
from services.evaluator.score import below_the_host_clock, count_ahead, hardware_for, score_workload
from services.evaluator.scratch import (
    hand_over_reference, hidden_timed_folder, make_folder, scratch_root, sweep_folders,
)
from services.evaluator.timer.plan import RECORDED_SETS, cubin_kernels
from services.evaluator.timer.route import IN_PROCESS, REPLAY, Routed, route, timer_job
from shared.errors import EvaluatorFault
from shared.hardware import HardwareSpec, cpu_name
from shared.schema import (
    AttemptInfo, Correctness, Environment, Evaluation, Language, Performance, Problem, Solution, SolScore, Status,
    Timing, Trace, Workload,
)
from shared.sol import problem_score

log = logging.getLogger(__name__)

CHILD = ["-m", "services.evaluator.harness"]


@dataclass(frozen=True)
class AttemptResult:
    status: Status
    traces: list[Trace]
    latency_ms: float | None
    speedup: float | None
    workloads_passed: int
    message: str
    sol_score: float | None = None  # mean of the workloads' displayed SOL scores, when all have one
    compile_ms: dict[str, float | None] = field(default_factory=dict)  # torch.compile measured this time
    child_phases: dict[str, dict[str, float]] = field(default_factory=dict)  # role -> seconds per phase

    def traces_jsonl(self) -> bytes:
        return "".join(t.model_dump_json(exclude_none=True) + "\n" for t in self.traces).encode()


@dataclass(frozen=True)
class _Outcome:
    status: Status
    message: str = ""
    check: Check | None = None
    latency_ms: float | None = None
    reference_ms: float | None = None
    timing: Timing | None = None
    sol: SolScore | None = None


def evaluate(problem: Problem, solution: Solution, config: EvalConfig, max_workloads: int | None = None,
             attempt: AttemptInfo | None = None, progress: Callable[[str], None] | None = None) -> AttemptResult:
    """Evaluate `solution` on the problem's workloads (the first `max_workloads` if given). A fault of
    this machine's (its own or the reference's file I/O refused: a full disk, a file size limit, no
    descriptors left) raises `EvaluatorFault`, retryable, instead of becoming a verdict."""
    try:
        return _evaluate(problem, solution, config, max_workloads, attempt, progress)
    except OSError as error:  # the evaluator's own I/O: a full disk, a file size limit, no descriptors left
        if is_fault(error):
            raise EvaluatorFault(f"the evaluator's machine refused its own I/O: {error}") from error
        raise


def _evaluate(problem: Problem, solution: Solution, config: EvalConfig, max_workloads: int | None,
              attempt: AttemptInfo | None, progress: Callable[[str], None] | None) -> AttemptResult:
    say = progress or (lambda _message: None)
    workloads = list(problem.workloads[:max_workloads] if max_workloads else problem.workloads)
    children = _Children(config, timer=solution.spec.language is Language.CUDA and config.replay,
                         problem_root=problem.root)
    try:
        dirs = children.dirs
        say("building")
        build = build_solution(solution, config.device, dirs["solution"], build_arch(config), config.build_cache)
        if build.status is not None:
            outcomes = [_Outcome(build.status, build.log)] * len(workloads)
            compiled: dict[str, float] = {}
        else:
            outcomes, compiled = _run(problem, solution, workloads, build, config, children, say)
    finally:
        children.close()
    traces = [_trace(problem, solution, w, o, config, attempt) for w, o in zip(workloads, outcomes)]
    return dataclasses.replace(_summarize(traces, compiled), child_phases=children.phases)


class _Children:
    """The attempt's folders and its two children: spares started ahead when the config has a
    pool (the candidate's spare folder becomes the attempt folder), else started when needed.

    Both are confined (`sandbox.isolation`): the candidate as `nobody`, the reference (a problem's
    code, untrusted too) as a user of its own (`unprivileged_ids("reference")`), writing only its
    home, the folder its input sets go to and the timed sets' folder. A spare reference started
    before its problem was known sees nothing of a problem folder in /tmp or /dev/shm, and reads
    only what others may: for such a problem (`spares.spare_sees`) the reference starts when needed,
    seeing its folder, and as the evaluator's own uid without capabilities where that folder is
    not readable by others."""

    def __init__(self, config: EvalConfig, timer: bool = False, problem_root: Path | None = None) -> None:
        self.config = config
        self.timer = timer  # a third child, the `cuda` timer (`timer_dirs`), after the record step
        self.problem_root = problem_root
        self.reference_ids = reference_ids(problem_root)  # once: it walks the problem's folder
        self.phases: dict[str, dict[str, float]] = {}
        self.spares: dict[str, Spare] = {}
        if config.spares is not None:
            self.spares = {role: config.spares.take(role, home)
                           for role, home in spare_homes(problem_root, timer, self.reference_ids).items()}
            root = self.spares["candidate"].root
        else:
            scratch = scratch_root(config)
            sweep_folders(scratch)
            root = make_folder("att", scratch)
        self.root = root
        self.dirs = {n: root / n for n in ("ref", "inputs", "cand", OUTPUTS, "solution")}
        # Where the reference saves its input sets: the attempt's inputs folder, or its spare's own
        # (linked into the attempt's once it is done: `reference_done`).
        self.dirs["ref_inputs"] = self.dirs["inputs"]
        # The timed sets' files until the outer clock's `go` (`hidden_timed_folder`): its spare's
        # own folder, else a scratch folder of their own; never in the attempt folder, which the
        # candidate sees.
        self.hidden: Path | None = None
        if "reference" in self.spares:
            spare_root = self.spares["reference"].root
            self.dirs.update(ref=spare_root / HOMES["reference"], ref_inputs=spare_root / REF_INPUTS,
                             timed=spare_root / REF_TIMED)
        else:
            self.hidden = hidden_timed_folder(root)
            self.dirs["timed"] = self.hidden / REF_TIMED
        for path in self.dirs.values():
            path.mkdir(mode=0o700, exist_ok=True)
        self.dirs["solution"].chmod(0o755)
        if "reference" not in self.spares:
            hand_over_reference(self.dirs["ref"], self.dirs["ref_inputs"], self.dirs["timed"], self.reference_ids)

    def started(self, role: str) -> StartedChild:
        spare = self.spares.get(role)
        if spare is None:
            if role == "reference":
                home = self.dirs["ref"]
                own = (home, self.dirs["ref_inputs"], self.dirs["timed"])
                ids: tuple[int, int] | None | str = self.reference_ids
                visible = (self.problem_root,) if self.problem_root is not None else ()
            else:
                folders = self.timer_dirs() if role == "timer" else {"home": self.dirs["cand"],
                                                                       "outputs": self.dirs[OUTPUTS]}
                home, own, ids, visible = folders["home"], (folders["home"], folders["outputs"]), "candidate", ()
            return start_child([*CHILD, "--wait", self.config.device], home, home / "child.log",
                               isolate=role in CONFINED, fork_server=self.config.fork_server,
                               memory_bytes=memory_limit(self.config.device), host_memory_bytes=memcap.bound_bytes(),
                               own_folders=own, shared_folders=shared_folders(self.config.device), ids=ids,
                               visible_folders=visible, parents=role != "reference",
                               pid_namespace=own_pid_namespace(self.config.device))
        return spare.child

    def reference_done(self) -> None:
        """The reference's input sets, saved in its spare's folder, linked into the attempt's inputs."""
        if self.dirs["ref_inputs"] != self.dirs["inputs"]:
            for path in self.dirs["ref_inputs"].iterdir():
                os.link(path, self.dirs["inputs"] / path.name)

    def timer_dirs(self) -> dict[str, Path]:
        """The timer child's folders (home, outputs, inputs, solution). Started on demand: a home and
        outputs of its own in the attempt's folder (not the record child's: what that child may have
        left running cannot write them). A spare sees only its own folder, fixed when it started:
        the solution and the input files read so far are copied (linked) there."""
        spare = self.spares.get("timer")
        if spare is None:
            found = {"home": self.root / "tim", "outputs": self.root / "tim_outputs",
                     "inputs": self.dirs["inputs"], "solution": self.dirs["solution"]}
            for name in ("home", "outputs"):
                found[name].mkdir(mode=0o700, exist_ok=True)
            return found
        found = {"home": spare.root / HOMES["candidate"], "outputs": spare.root / OUTPUTS,
                 "inputs": spare.root / "inputs", "solution": spare.root / "solution"}
        if not found["solution"].exists():
            shutil.copytree(self.dirs["solution"], found["solution"])
            found["inputs"].mkdir(mode=0o700)
            for path in self.dirs["inputs"].iterdir():
                os.link(path, found["inputs"] / path.name)
        return found

    def wait_ready(self) -> None:
        for spare in self.spares.values():
            spare.wait_ready(SPARE_READY_S)

    def close(self) -> None:
        for spare in self.spares.values():
            discard(spare)
        shutil.rmtree(self.root, ignore_errors=True)
        if self.hidden is not None:
            shutil.rmtree(self.hidden, ignore_errors=True)


def _run(problem: Problem, solution: Solution, workloads: list[Workload], build: Build,
         config: EvalConfig, children: _Children, say: Callable[[str], None]) -> list[_Outcome]:
    dirs = children.dirs
    common = {
        "definition": problem.definition,
        "device": config.device,
        "correctness_rounds": config.correctness_rounds,
        "timing_sets": config.timing_sets,
        "timed_bytes": config.timed_bytes,
        "regenerate_inputs": config.regenerates_inputs,
        "warmup_runs": config.warmup_runs,
        "timing_runs": config.timing_runs,
        "timing_budget_s": config.timing_budget_s,
        "inputs_dir": str(dirs["inputs"]),
    }
    hardware = _hardware(config)
    if hardware is not None:  # T_sol's counts, while the children run
        count_ahead(problem.definition, workloads, problem.root)
    say(f"reference on {len(workloads)} workloads")
    # Spares wait until both have warmed up, so that neither's start overlaps the other's timing.
    children.wait_ready()
    clock = config.outer_clock
    reference = run_child(dirs["ref"], config, lambda: children.started("reference"), ReferenceJob(
        **{**common, "inputs_dir": str(dirs["ref_inputs"])}, seed=secrets.randbits(48), checker=True,
        timed_dir=str(dirs["timed"]) if clock else None,
        measure_compile=config.measure_compile,
        problem_root=str(problem.root) if problem.root else None,
        workloads=workloads, indices=list(range(len(workloads)))))
    children.phases["reference"] = reference.phases
    children.reference_done()
    outcomes: list[_Outcome | None] = []
    runnable = []
    results = reference.results([w.uuid for w in workloads], "the reference")
    try:
        _raise_faults(workloads, results)
    except EvaluatorFault:
        if reference.checker is not None:
            reference.checker.close()
        raise
    for index, result in enumerate(results):
        if result["status"] == "OK":
            outcomes.append(None)
            runnable.append(index)
        else:
            outcomes.append(_Outcome(*reference_failed(problem, _check_device(config), result["message"])))
    ref_results = reference.results([w.uuid for w in workloads], "the reference")
    compiled = {w.uuid: r.get("compile_ms") for w, r in zip(workloads, ref_results)
                if "compile_ms" in r or "compile_error" in r}  # None: torch.compile failed on it
    checker = reference.checker
    try:
        if runnable and checker is None:  # its results are in, but it ended before it could check
            why = ""
            if reference.memory_exceeded_bytes:
                why = (f" (it went over its host-memory bound of {reference.memory_exceeded_bytes / 2**30:.1f} GiB "
                       f"and was killed by the kernel; on a CPU the input sets it saves in /dev/shm count there)")
            elif reference.exit_code is not None:
                why = f" (exit code {reference.exit_code})"
            for index in runnable:
                outcomes[index] = _Outcome(Status.INVALID_REFERENCE, "the reference's process ended before it "
                                           f"could check the solution's outputs{why}:\n{reference.log}")
        if not runnable or checker is None:
            return outcomes, compiled
        return _run_candidate(problem, solution, workloads, build, config, children, say, common, reference,
                              ref_results, runnable, outcomes, compiled, checker), compiled
    finally:
        if checker is not None:
            checker.close()


def _run_candidate(problem: Problem, solution: Solution, workloads: list[Workload], build: Build,
                   config: EvalConfig, children: _Children, say: Callable[[str], None], common: dict,
                   reference, ref_results: list[dict], runnable: list[int], outcomes: list,
                   compiled: dict, checker) -> list[_Outcome]:
    """The candidate's child on the workloads the reference ran; each workload's outputs checked
    by `checker` at its `end` (outer clock on) or after the candidate (off)."""
    dirs = children.dirs
    clock = config.outer_clock
    hardware = _hardware(config)
    # The candidate runs as the same user: the reference's job (with the attempt's secret) must be
    # gone from disk before it starts. The expected outputs never were on disk.
    shutil.rmtree(dirs["ref"])
    say(f"candidate on {len(runnable)} workloads")
    rounds = config.correctness_rounds
    timed = {workloads[i].uuid: (i, ref_results[i]) for i in runnable}
    inputs_dir = dirs["inputs"]  # the timer child's own where it has a spare (`_Children.timer_dirs`)
    hand_over = timed_hand_over(dirs["timed"], inputs_dir, rounds, timed)
    verdicts: dict[int, Check] = {}
    faults: list[str] = []  # the evaluator's, met while checking (`seal`): the attempt is retried

    def make_sets(index: int, first: int, count: int) -> dict | None:
        """A re-timed batch's fresh sets, made in the checker; files moved where the candidate reads them."""
        payload = checker.more(index, first, count)
        if payload is not None and payload["set_seeds"] is None:
            move_timed_sets(dirs["timed"], inputs_dir, index, range(first, first + count))
        return payload

    retimer = Retimer(reference.clock.windows if reference.clock is not None else {}, timed, rounds,
                      config.outer_clock_retimes, config.outer_clock_slack_ms, make_sets, verdicts.get)

    def seal(uuid: str, runs: int, shared: dict | None) -> None:
        """At the candidate's `end`: its outputs checked as they are now (`checks.check_sets`), from
        its GPU memory for the sets it shared (`gpu_handover`); a re-timed batch's sets only."""
        index, made = timed[uuid]
        first = retimer.first_set(uuid)
        try:
            verdicts[index] = checker.check(index, max(0, min(runs, made["timed_sets"])), outputs_dir, shared,
                                            first=first if first != rounds else None)
        except Exception as error:  # the checker lost or the evaluator's own failure: no verdict (`faults`)
            log.exception("checking workload %s failed", uuid)
            faults.append(f"workload {uuid}: {error}")
            verdicts[index] = Check(Status.RUNTIME_ERROR, f"checking these outputs failed in the evaluator: {error}")

    def job(runnable: list[int]) -> CandidateJob:
        return CandidateJob(
            **common, outputs_dir=str(outputs_dir), solution_dir=str(dirs["solution"]),
            entry_file=solution.entry_file, entry_symbol=solution.entry_symbol, tunables=build.tunables,
            language=solution.spec.language.value, gpu_handover=clock and config.gpu_handover,
            artifact_path=str(build.artifact_path) if build.artifact_path else None,
            destination_passing_style=solution.spec.destination_passing_style,
            workloads=[workloads[i] for i in runnable], indices=runnable,
            timed_sets=[ref_results[i]["timed_sets"] for i in runnable],
            # Each set's own seed, not the secret it was hashed from: it gives the set's values, which
            # the candidate gets anyway; with the outer clock, the timed sets' only at `go`. None: the
            # workload's sets are files in `inputs_dir`.
            set_seeds=[_given(ref_results[i].get("set_seeds"), rounds, clock) for i in runnable],
            set_digests=[_given(ref_results[i].get("set_digests"), rounds, clock) for i in runnable])

    home, outputs_dir, role, routed = dirs["cand"], dirs["outputs"], "candidate", None
    if children.timer:  # language `cuda`: its launch plans recorded first, then timed without its Python
        routed = _record(problem, workloads, runnable, job(runnable), build, config, children, say)
        if config.probe is not None:
            config.probe(routed, build)
        for index, (status, message) in routed.failed.items():
            outcomes[index] = _Outcome(status, message)
        runnable = [i for i in runnable if i not in routed.failed]
        if not runnable:
            return outcomes
        say(f"timer on {len(runnable)} workloads ({routed.mode})")  # the record step's own time ends here
        folders = children.timer_dirs()
        home, outputs_dir, inputs_dir, role = folders["home"], folders["outputs"], folders["inputs"], "timer"
        hand_over = timed_hand_over(dirs["timed"], inputs_dir, rounds, timed)
    timing_job = job(runnable) if routed is None or routed.plans is None else timer_job(job(runnable), routed.plans)
    if role == "timer":
        timing_job = timing_job.model_copy(update={
            "inputs_dir": str(folders["inputs"]), "solution_dir": str(folders["solution"]),
            "artifact_path": str(folders["solution"] / build.artifact_path.name)})
    # Replayed, nothing of the solution's runs on the host that times it: no re-time (a window over
    # its allowance could only be honest jitter there); its window stays on the trace.
    retimes = clock and (routed is None or routed.mode != REPLAY)
    candidate = run_child(home, config, lambda: children.started(role), timing_job,
                          hand_over, seal if clock else None, retimer if retimes else None)
    sent = [workloads[i].uuid for i in runnable]
    children.phases["candidate"] = candidate.phases
    children.phases["checker"] = {k: round(v, 4) for k, v in checker.seconds.items()}  # the host's wait on it
    known_compile = {**(config.compile_baselines or {}), **compiled}
    say("checking")
    mode, reason = (routed.mode, routed.reason) if routed is not None else (IN_PROCESS, None)
    reported = candidate.results(sent, "the solution")
    _raise_faults([workloads[i] for i in runnable], reported)
    if faults:  # the checker lost, or the evaluator's own checking failed: no verdict on these outputs
        raise EvaluatorFault("; ".join(faults))
    for index, result in zip(runnable, reported):
        if result["status"] != "OK":
            outcomes[index] = _Outcome(_candidate_status(result["status"]),
                                       "\n".join(m for m in (reason, result["message"]) if m))
            continue
        uuid, timed_sets = workloads[index].uuid, ref_results[index]["timed_sets"]
        clock_account = candidate.clock_account(reference, uuid, result, timed_sets, config.outer_clock_slack_ms,
                                                retimer.load.get(uuid))
        if isinstance(clock_account, str):  # a forged result
            outcomes[index] = _Outcome(Status.REWARD_HACK, clock_account)
            continue
        if clock_account is not None and mode == REPLAY:  # the outer clock's figure is never charged there
            clock_account = dataclasses.replace(clock_account, latency_ms=result["latency"]["median_ms"], charged=False)
        check = _verdict(index, timed_runs(result, timed_sets), verdicts, checker, outputs_dir, clock)
        reported, eager = result["latency"]["median_ms"], ref_results[index]["latency"]["median_ms"]
        # Impossible reports are judged as reported; the score takes what the outer clock charged.
        latency = clock_account.latency_ms if clock_account is not None else reported
        frozen = below_the_host_clock(config.device, reported) \
            if config.host_clock_floor and check.status is Status.PASSED else None
        if frozen:
            outcomes[index] = _Outcome(Status.REWARD_HACK, frozen, check)
            continue
        compile_ms = known_compile.get(uuid)
        verdict = score_workload(problem.definition, workloads[index], problem.root, hardware, reported, eager,
                                 compile_ms) if check.status is Status.PASSED else None
        if verdict is not None and verdict.hack:
            outcomes[index] = _Outcome(Status.REWARD_HACK, verdict.hack, check)
            continue
        if verdict is not None and latency != reported:
            verdict = score_workload(problem.definition, workloads[index], problem.root, hardware, latency, eager,
                                     compile_ms)
        timing = Timing(**result["latency"], **(clock_account.timing() if clock_account is not None else {}),
                        **reference_quartiles(ref_results[index]["latency"]), mode=mode, in_process_reason=reason)
        message = "\n".join(m for m in (reason, check.message) if m)
        if clock_account is not None and clock_account.charged and check.status is Status.PASSED:
            message = (f"charged {latency:.4g} ms per run, the outer clock's figure (its own median "
                       f"{reported:.4g} ms): no timed batch fitted its allowance in {clock_account.retimes + 1} "
                       f"tries, the last {clock_account.window_ms:.1f} ms against {clock_account.allowed_ms:.1f} ms")
        outcomes[index] = _Outcome(check.status, message, check, latency, eager, timing,
                                   verdict.sol if verdict else None)
    return outcomes


def reference_quartiles(latency: dict[str, Any]) -> dict[str, float | None]:
    """The reference's interval and timed runs for the trace's timing (None where its child reported none)."""
    return {"reference_q1_ms": latency.get("q1_ms"), "reference_q3_ms": latency.get("q3_ms"),
            "reference_runs": latency.get("runs")}


def _record(problem: Problem, workloads: list[Workload], runnable: list[int], job: CandidateJob, build: Build,
            config: EvalConfig, children: _Children, say: Callable[[str], None]) -> Routed:
    """The record step of a `cuda` attempt: the candidate's child in record mode (no outer clock:
    nothing is timed there), its two plans per workload judged by `timer.route`."""
    if config.correctness_rounds < RECORDED_SETS:
        return Routed(reason=f"not replayed, timed in the solution's own process: {config.correctness_rounds} "
                             f"correctness round, and a plan is recorded on {RECORDED_SETS} input sets")
    say(f"recording launch plans on {len(runnable)} workloads")
    recorded = run_child(children.dirs["cand"], dataclasses.replace(config, outer_clock=False),
                         lambda: children.started("candidate"), job.model_copy(update={"mode": "record"}))
    children.phases["record"] = recorded.phases
    reported = recorded.results([workloads[i].uuid for i in runnable], "the solution")
    _raise_faults([workloads[i] for i in runnable], reported)
    results = dict(zip(runnable, reported))
    kernels = cubin_kernels(build.artifact_path.read_bytes())
    return route(problem.definition, {i: workloads[i] for i in runnable}, results, kernels,
                 job.destination_passing_style)


def _raise_faults(workloads: list[Workload], results: list[dict]) -> None:
    """`EvaluatorFault` where a child reported workloads it could not run for the machine's fault
    (`EVALUATOR_FAULT`: its file I/O refused, the device's context not made): no verdict, the
    attempt is retried later or elsewhere. A candidate could report one falsely: that costs it its
    attempt's retries and gains it nothing (`record.give_up`: NOT_EVALUATED, never a pass)."""
    faults = [f"workload {w.uuid}: {r['message']}" for w, r in zip(workloads, results)
              if r.get("status") == EVALUATOR_FAULT]
    if faults:
        raise EvaluatorFault("; ".join(faults))


def _verdict(index: int, runs: int, verdicts: dict[int, Check], checker, outputs_dir: Path, clock: bool) -> Check:
    """The checker's verdict on a workload the candidate reports as done: the one taken at its `end`
    (outer clock on; a set missing then but there now was made after the window), else taken now."""
    if runs < 0:
        return Check(Status.REWARD_HACK, "the solution's timing reported a count of timed runs that its "
                                         "timed input sets cannot account for (a forged result)")
    check = verdicts.get(index) if clock else checker.check(index, runs, outputs_dir)
    if check is None:  # reported done without an `end`: the outer clock's verdict said so first
        return Check(Status.REWARD_HACK, "no outputs were checked at the end of the timed batch")
    if clock and check.missing is not None and (outputs_dir / f"w{index}_s{check.missing}.st").exists():
        return Check(Status.REWARD_HACK, f"the outputs of input set {check.missing} were not there (or not a "
                                         f"file of their size) when the evaluator's window on the timed runs "
                                         f"closed: made after the window, out of its clock's sight")
    return check


def _given(per_set: list | None, rounds: int, clock: bool) -> list | None:
    """What the candidate's job holds of a workload's per-set seeds or digests: all, or only the
    correctness rounds' where the outer clock hands over the timed sets' at `go`."""
    return per_set[:rounds] if clock and per_set is not None else per_set


def _candidate_status(reported: str) -> Status:
    """The candidate's statuses are the verdict's, but one: an input set it could not make again
    identically from its seed (with no tampering the guard sees) is the workload's doing, not the
    solution's: INVALID_REFERENCE, as when the reference's own process cannot make a set."""
    return Status.INVALID_REFERENCE if reported == NOT_REPRODUCED else Status(reported)


def _trace(problem: Problem, solution: Solution, workload: Workload, outcome: _Outcome, config: EvalConfig,
           attempt: AttemptInfo | None) -> Trace:
    correctness = performance = None
    if outcome.check is not None and outcome.status in (Status.PASSED, Status.INCORRECT_NUMERICAL):
        correctness = Correctness(max_absolute_error=outcome.check.max_absolute_error,
                                  max_relative_error=outcome.check.max_relative_error,
                                  extra={"matched_ratio": outcome.check.matched_ratio})
    if outcome.status is Status.PASSED:
        performance = Performance(latency_ms=outcome.latency_ms, reference_latency_ms=outcome.reference_ms,
                                  speedup_factor=outcome.reference_ms / max(outcome.latency_ms, 1e-9))
    evaluation = Evaluation(status=outcome.status, environment=environment(config.device),
                            timestamp=datetime.now(timezone.utc).isoformat(), log=outcome.message,
                            correctness=correctness, performance=performance,
                            timing=outcome.timing if outcome.status is Status.PASSED else None,
                            sol=outcome.sol if outcome.status is Status.PASSED else None)
    return Trace(definition=problem.name, workload=workload, solution=solution.name, evaluation=evaluation,
                 attempt=attempt)


def _summarize(traces: list[Trace], compiled: dict[str, float]) -> AttemptResult:
    failed = [t.evaluation for t in traces if t.evaluation.status is not Status.PASSED]
    passed = [t.evaluation.performance for t in traces if t.evaluation.status is Status.PASSED]
    if failed or not traces:
        first = failed[0] if failed else None
        status = first.status if first else Status.RUNTIME_ERROR
        return AttemptResult(status, traces, None, None, len(passed), first.log if first else "no workloads",
                             compile_ms=compiled)
    latency = sum(p.latency_ms for p in passed) / len(passed)
    speedup = math.exp(sum(math.log(max(p.speedup_factor, 1e-12)) for p in passed) / len(passed))
    sols = [t.evaluation.sol.score for t in traces if t.evaluation.sol is not None]
    score = problem_score(sols) if len(sols) == len(traces) else None
    return AttemptResult(Status.PASSED, traces, latency, speedup, len(passed), "", score, compiled)


def warm_up(device: str) -> None:
    """What the evaluator's own process pays once, done ahead at start: its CUDA context, and the
    import that the first SOL count of a process pays (on the H200 the first attempt of a process
    spent 3.4-9 s more than the next ones, 2026-12-03). The checks themselves run in the checker
    (the reference's process), not here."""
    target = torch.device(device)
    if target.type == "cuda":
        torch.empty(1, device=target)
        torch.cuda.synchronize(target)
        importlib.import_module("torch._dynamo")  # what the first SOL count of a process imports (1.5-3.4 s)


def environment(device: str) -> Environment:
    libs = {"torch": torch.__version__}
    if device.startswith("cuda") and torch.cuda.is_available():
        return Environment(hardware=torch.cuda.get_device_name(torch.device(device)), libs=libs)
    return Environment(hardware=f"CPU {cpu_name()}", libs=libs)


def _hardware(config: EvalConfig) -> HardwareSpec | None:
    if config.hardware is not None or not config.device.startswith("cuda") or not torch.cuda.is_available():
        return config.hardware
    return hardware_for(torch.cuda.get_device_name(torch.device(config.device)))


def build_arch(config: EvalConfig) -> str | None:
    if config.arch or not config.device.startswith("cuda") or not torch.cuda.is_available():
        return config.arch
    return arch_for(torch.cuda.get_device_capability(torch.device(config.device)))


def _check_device(config: EvalConfig) -> torch.device:
    """Where the parent holds expected outputs and compares: the evaluator's GPU when it has one."""
    if config.device.startswith("cuda") and torch.cuda.is_available():
        return torch.device(config.device)
    return torch.device("cpu")



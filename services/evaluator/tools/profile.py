"""The `profile` tool: a `cuda` solution's kernels on one workload under Nsight Compute.

The attempt runs as an evaluation of that one workload (`evaluate.evaluate`): the reference makes
its inputs, the solution's `launch.py` runs only in its confined record child, the timer times the
replayed plan; on the way the hook (`EvalConfig.probe`) keeps the validated launch plan and the
cubin. Then ncu profiles a trusted process of ours (`target`) that replays that plan on the cubin
on a fresh input set: no Python of the solution's runs under the profiler, and only the cubin's
kernels do. That process and ncu itself run with a scrubbed environment, their own session, a hard
timeout, the sandbox's limits, a network namespace with only its own loopback, and a private view
of the file systems, read-only but their folder; as the evaluator's own user with its
capabilities, since the GPU's performance counters are an administrator's by default
(NVreg_RestrictProfilingToAdminUsers). The answer is text for the writer (`ncu.summary`) beside
the evaluation's own verdict and median on the workload; nothing of it is a verdict.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from services.evaluator.config import EvalConfig
from services.evaluator.evaluate import AttemptResult, evaluate, scratch_root
from services.evaluator.sandbox.confine import CLONE_NEWNET, LIMITS, set_limit
from services.evaluator.sandbox.fsview import SCRATCH_MOUNTS, encoded_view, private_view
from services.evaluator.sandbox.isolation import candidate_view, kill_group, scrubbed_env, shared_folders
from services.evaluator.scratch import make_folder
from services.evaluator.tools import ncu
from services.evaluator.tools.target import ProfileJob
from shared.process import libc, set_parent_death_signal
from shared.schema import Language, Problem, Solution, Status

PROFILE_TIMEOUT_S = 180.0  # with the evaluation before it, inside the task's hard limit (celery_app)
LOG_TAIL_CHARS = 1200
NCU_PLACES = ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute")
# The evaluation's verdicts after which its kernels are profiled: they ran to their end. One that
# hung, crashed or cheated is answered with its own status (ncu would only run it again).
PROFILED_VERDICTS = frozenset({Status.PASSED, Status.INCORRECT_NUMERICAL, Status.INCORRECT_SHAPE,
                               Status.INCORRECT_DTYPE})
# ncu's words where the machine, not the kernel, stops it (seen on gVisor: LibraryNotLoaded).
NO_PROFILER = ("Failed to initialize the profiler", "LibraryNotLoaded")
SIOCSIFFLAGS, IFF_UP, IFF_LOOPBACK, IFF_RUNNING = 0x8914, 0x1, 0x8, 0x40


@dataclass(frozen=True)
class Profiled:
    status: Status | None  # None: profiled (PROFILED); else the error's status, `text` its reason
    text: str
    latency_ms: float | None = None  # the evaluation's median on the workload, where it passed


@dataclass
class _Kept:
    """What the probe keeps of the record step: the plan of the workload and the cubin's bytes."""
    plan: dict | None = None
    cubin: bytes | None = None
    reason: str | None = None


def find_ncu() -> str | None:
    found = shutil.which("ncu")
    if found:
        return found
    for place in NCU_PLACES:
        path = Path(place)
        if path.is_file():
            return str(path)
        if path.is_dir():  # /opt/nvidia/nsight-compute/<version>/ncu, the newest
            versions = sorted((p for p in path.glob("*/ncu") if p.is_file()), reverse=True)
            if versions:
                return str(versions[0])
    return None


def profile_workload(problem: Problem, solution: Solution, config: EvalConfig, dram_peak_gbps: float | None = None,
                     hardware: str = "") -> Profiled:
    """`problem` holds the one workload to profile. UNSUPPORTED where this evaluator cannot (no
    GPU, no ncu, not `cuda`, a plan that is not replayed); the evaluation's failure where it fails
    before its plan is judged (a build, the reference, the record step)."""
    why = _unsupported(problem, solution, config)
    if why:
        return Profiled(Status.UNSUPPORTED, why)
    workload = problem.workloads[0]
    kept = _Kept()

    def probe(routed, build) -> None:
        if routed.plans is not None and workload.uuid in routed.plans:
            kept.plan = routed.plans[workload.uuid].model_dump(mode="json")
            kept.cubin = build.artifact_path.read_bytes()
        kept.reason = routed.reason

    result = evaluate(problem, solution, dataclasses.replace(config, probe=probe, measure_compile=False))
    verdict = _verdict(result)
    if kept.plan is None or result.status not in PROFILED_VERDICTS:  # nothing to replay, or it hung, crashed, cheated
        if result.status is not Status.PASSED:
            return Profiled(result.status, result.message or f"the evaluation ended {result.status.value}")
        return Profiled(Status.UNSUPPORTED, "profile replays the solution's recorded launches, and these were "
                                            f"not replayed: {kept.reason or 'no launch plan was kept'}")
    folder = make_folder("prof", scratch_root(config))
    try:
        status, text = _run_ncu(folder, problem, solution, config, kept, find_ncu() or "ncu", dram_peak_gbps)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if status is not None:
        return Profiled(status, text)
    header = f"profile of workload {workload.uuid} ({_axes(workload)}) on {hardware or config.device}, Nsight Compute"
    return Profiled(None, "\n".join([header, verdict, text]), result.latency_ms)


def _unsupported(problem: Problem, solution: Solution, config: EvalConfig) -> str | None:
    if solution.spec.language is not Language.CUDA:
        return (f"profile runs `cuda` solutions (their recorded launches, replayed); this one is "
                f"{solution.spec.language.value}")
    if not config.device.startswith("cuda"):
        return f"profile needs a GPU evaluator; this one runs on {config.device}"
    if len(problem.workloads) != 1:
        return f"profile takes one workload; {len(problem.workloads)} were given"
    if find_ncu() is None:
        return "Nsight Compute (ncu) is not installed on this evaluator"
    return None


def _verdict(result: AttemptResult) -> str:
    trace = result.traces[0] if result.traces else None
    if trace is None:
        return "the evaluator's own run of this workload: none"
    evaluation = trace.evaluation
    if evaluation.performance is not None:
        return (f"the evaluator's own run of this workload: {evaluation.status.value}, median "
                f"{evaluation.performance.latency_ms:.4g} ms (L2 flushed per run, as ncu's --cache-control all)")
    return (f"the evaluator's own run of this workload: {evaluation.status.value} (figures of a kernel that did "
            f"not pass)")


def _axes(workload) -> str:
    return ", ".join(f"{k}={v}" for k, v in workload.axes.items()) or "no axes"


def _run_ncu(folder: Path, problem: Problem, solution: Solution, config: EvalConfig, kept: _Kept, tool: str,
             dram_peak_gbps: float | None) -> tuple[Status | None, str]:
    home = folder / "home"
    home.mkdir(mode=0o700)
    cubin = folder / "kernels.cubin"
    cubin.write_bytes(kept.cubin)
    job = ProfileJob(cubin_path=str(cubin), plan=kept.plan, definition=problem.definition,
                     workload=problem.workloads[0], device=config.device,
                     destination_passing_style=solution.spec.destination_passing_style,
                     seed=secrets.randbits(48), problem_root=str(problem.root) if problem.root else None)
    (folder / "job.json").write_text(job.model_dump_json())
    log_file, console = home / "ncu.csv", home / "console.log"
    command = ncu.command(tool, [sys.executable, "-m", "services.evaluator.tools.target", str(folder / "job.json")],
                          log_file)
    # Read-only where they lie in /tmp or /dev/shm (its view empties those): the problem's folder
    # (its safetensors inputs) and ncu's own, where it is installed there.
    visible = tuple(Path(p) for p in (problem.root, Path(tool).resolve().parent) if p is not None
                    and any(str(p).startswith(os.fsdecode(m) + os.sep) for m in SCRATCH_MOUNTS))
    view = encoded_view(candidate_view((home,), shared_folders(config.device), visible, parents=True))
    hook = _confinement(view, libc())
    with open(console, "wb") as out:
        process = subprocess.Popen(command, cwd=home, env=scrubbed_env(home), stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=hook)
        try:
            code = process.wait(timeout=PROFILE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            kill_group(process)
    text = log_file.read_text(errors="replace") if log_file.exists() else ""
    tail = _tail(console.read_text(errors="replace") + "\n" + text)
    if code is None:
        return Status.TIMEOUT, f"the profiled replay ran past {PROFILE_TIMEOUT_S:.0f} s and was stopped\n{tail}"
    if "ERR_NVGPUCTRPERM" in text + tail:
        return Status.UNSUPPORTED, ("this evaluator may not read the GPU's performance counters "
                                    "(ERR_NVGPUCTRPERM: profiling is restricted to administrators)")
    refused = next((line for line in (text + "\n" + tail).splitlines() if any(m in line for m in NO_PROFILER)), None)
    if refused is not None:  # the machine's (a sandboxed kernel without the profiler's driver support)
        return Status.UNSUPPORTED, f"Nsight Compute cannot profile on this evaluator: {refused.strip()[:300]}"
    try:
        launches = ncu.parse(text)
    except ValueError:
        return Status.RUNTIME_ERROR, f"ncu gave no figures (exit {code}):\n{tail}"
    return None, ncu.summary(launches, dram_peak_gbps)


def _confinement(view: tuple[tuple[bytes, bool], ...], lib):
    """Between fork and exec of ncu: the sandbox's limits, the OOM killer's first choice, a network
    namespace with its loopback up (ncu talks to its target over it), a private view of the file
    systems (as root, where the evaluator runs as root), death with the evaluator."""

    def hook() -> None:
        for limit, value in LIMITS.items():
            set_limit(limit, value)
        try:
            with open("/proc/self/oom_score_adj", "w") as score:
                score.write("1000")
        except OSError:
            pass  # the kernel keeps its own choice
        if os.geteuid() == 0:
            if lib.unshare(CLONE_NEWNET) == 0:
                _loopback_up()
            if view and not private_view(view, lib):
                os.write(2, b"kernelswarm profile: no private view here; files outside its folder stay writable\n")
        set_parent_death_signal(signal.SIGKILL, lib)

    return hook


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as handle:
        fcntl.ioctl(handle, SIOCSIFFLAGS, struct.pack("16sh", b"lo", IFF_UP | IFF_LOOPBACK | IFF_RUNNING))


def _tail(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith('"')]
    return "\n".join(lines)[-LOG_TAIL_CHARS:]


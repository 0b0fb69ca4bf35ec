"""Scoring a passed workload against the speed of light: T_sol from the SOL model on the evaluator's
hardware row, T_b the faster of the eager reference (timed in this attempt) and torch.compile (timed
once and cached), S = 1/(1 + (T_k − T_sol)/(T_b − T_sol)). A time below the most permissive physical
floor is `REWARD_HACK`, never a record.

On a device without a hardware row (the CPU, an unknown GPU) T_sol is priced at the ceilings its
evaluator measured at start (`HardwareSpec.measured_only`), where it has a calibration, else there is
none and traces carry no SOL block; either way no physical floor applies there (a CPU's caches beat
its measured copy bandwidth). On a device timed by the host's clock (the CPU) one floor
still does: a median below half the shortest call that clock can time here (`below_the_host_clock`)
is a frozen or forged timer, not a measurement.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from services.evaluator.harness.timing import host_clock_floor_ms
from services.evaluator.sandbox.counting import SandboxRunner
from shared.hardware import HardwareSpec, UnknownHardwareError, lookup
from shared.schema import Definition, SolScore, Workload
from shared.sol import SolCountError, baseline_ms, estimate, hack_floor_ms, sol_score
from shared.sol_bounded import CountLimits, SolUnknownError, count_workloads
from shared.sol_count import WorkCount

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Verdict:
    sol: SolScore | None
    hack: str | None  # why the time cannot be real, or None


def hardware_for(device_name: str) -> HardwareSpec | None:
    try:
        return lookup(device_name)
    except UnknownHardwareError:
        return None


_COUNTED: dict[tuple[str, str], Future] = {}
MAX_COUNTED = 4096
# One thread counts, ahead of the scoring, in a child with a memory and a time limit
# (`shared.sol_bounded`: one child for the workloads of an attempt not counted yet): a problem with
# custom inputs runs its reference on the CPU with real values, which must not take the evaluator's
# memory or time (SOL-ExecBench's quantisation references took 22 GB in-process), while the
# evaluator only waits for its children. A workload past the limits has no T_sol.
_COUNTER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sol-count")
_LOCK = threading.Lock()
COUNT_LIMITS = CountLimits()  # the settings' sol_count_memory_mb and sol_count_time_s (`use_count_limits`)
RUNNER = SandboxRunner()  # the child runs the problem's reference: confined as a candidate is


def use_count_limits(limits: CountLimits) -> None:
    """The limits every count of this process runs under from now on: the evaluator service sets its
    settings' at start (`tasks.register`); `kernelswarm eval` and tests keep the defaults."""
    global COUNT_LIMITS
    COUNT_LIMITS = limits


def _key(definition: Definition, workload: Workload) -> tuple[str, str]:
    return hashlib.sha256(definition.model_dump_json().encode()).hexdigest(), workload.model_dump_json()


def count_ahead(definition: Definition, workloads: list[Workload], problem_root: Path | None) -> None:
    """Starts counting the workloads' work in the background (`score_workload` waits for it)."""
    _futures(definition, workloads, problem_root)


def _futures(definition: Definition, workloads: list[Workload], problem_root: Path | None) -> list[Future]:
    """The workloads' counts, those not asked for before submitted to one bounded child."""
    keys = [_key(definition, w) for w in workloads]
    with _LOCK:
        if len(_COUNTED) + len(keys) > MAX_COUNTED:
            _COUNTED.clear()
        new = {key: w for key, w in zip(keys, workloads) if key not in _COUNTED}
        fresh = {key: Future() for key in new}
        _COUNTED.update(fresh)
        futures = [_COUNTED[key] for key in keys]
    if new:
        _COUNTER.submit(_count_into, definition, list(new.values()), problem_root, list(fresh.values()))
    return futures


def _count_into(definition: Definition, workloads: list[Workload], problem_root: Path | None,
                futures: list[Future]) -> None:
    try:
        counted = count_workloads(definition, workloads, problem_root, runner=RUNNER, limits=COUNT_LIMITS)
    except BaseException as error:  # the futures' waiters get it; nothing is swallowed
        for future in futures:
            future.set_exception(error)
        raise
    for count, future in zip(counted, futures, strict=True):
        if count.work is None:
            future.set_exception(SolUnknownError(count.message or "not counted", count.reason))
        else:
            future.set_result(count.work)


def _counted(definition: Definition, workload: Workload, problem_root: Path | None) -> WorkCount:
    """The workload's count, remembered per (definition, workload): counting can run the reference
    on the CPU (custom inputs), which must not be paid again on every attempt. A count that failed
    (SolCountError, SolUnknownError past the limits) is remembered too."""
    [future] = _futures(definition, [workload], problem_root)
    return future.result()


def score_workload(definition: Definition, workload: Workload, problem_root: Path | None,
                   hardware: HardwareSpec | None, latency_ms: float, eager_ms: float,
                   compile_ms: float | None) -> Verdict:
    if hardware is None:
        return Verdict(None, None)
    try:
        work = _counted(definition, workload, problem_root)
    except SolCountError as error:
        log.info("no T_sol for %s %s: %s", definition.name, workload.uuid, error)
        return Verdict(None, None)
    floor = hack_floor_ms(work, hardware) if hardware.datasheet else 0.0  # measured ceilings: no floor
    if latency_ms < floor:
        return Verdict(None, f"median latency {latency_ms:.6g} ms is below the physical floor {floor:.6g} ms on "
                             f"{hardware.name} (work and bytes counted from the reference): the measurement "
                             f"cannot be real")
    try:
        sol = estimate(work, hardware)
    except ValueError as error:  # a row without a rate for the work's precision: no score, the verdict stands
        log.warning("no T_sol for %s %s on %s: %s", definition.name, workload.uuid, hardware.name, error)
        return Verdict(None, None)
    t_b = baseline_ms(eager_ms, compile_ms)
    score = sol_score(latency_ms, t_b, sol.t_sol_ms)
    datasheet = measured = None
    if hardware.calibrated:  # both sources beside the faster of the two that T_sol is priced at
        datasheet = estimate(work, hardware, ceilings="datasheet").t_sol_ms
        measured = estimate(work, hardware, ceilings="measured").t_sol_ms
    return Verdict(SolScore(t_sol_ms=sol.t_sol_ms, t_baseline_ms=t_b, score=score.display, bound=sol.bound.value,
                            hardware=hardware.name, t_sol_datasheet_ms=datasheet, t_sol_measured_ms=measured), None)


HOST_FLOOR_FRACTION = 0.5  # margin for two processes' clock speeds; an honest run is far above it


def below_the_host_clock(device: str, latency_ms: float) -> str | None:
    """On a device whose runs the host's clock times (not CUDA: there the SOL floor and CUPTI's own
    clock apply), why `latency_ms` cannot be a measurement, or None. Every honest run brackets at
    least an empty call between two readings of that clock, so a median below half the fastest
    such bracket (timed in this, the evaluator's, process: `timing.host_clock_floor_ms`) comes
    from a timer frozen or rewritten in the candidate's process, or from forged figures. A liar
    that reports a plausible time for a short kernel stays above it (docs/results/hardening.md)."""
    if device.startswith("cuda"):
        return None
    shortest = host_clock_floor_ms()
    if latency_ms >= HOST_FLOOR_FRACTION * shortest:
        return None
    return (f"median latency {latency_ms:.6g} ms is below half of the shortest call this machine's clock can time "
            f"({shortest:.6g} ms between two readings around an empty call, timed by the evaluator): the "
            f"measurement cannot be real (a frozen or rewritten timer, or forged results)")

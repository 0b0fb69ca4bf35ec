"""Speed of light: the time the hardware needs for a workload's work, and the SOL score.

    T_sol = max(matrix FLOPs / matrix peak(precision), bytes / DRAM bandwidth)

    kernelswarm sol PROBLEM_DIR [--hardware NAME] [--mode physical|solar] [--json]

Work is counted once per (definition, workload), independent of the hardware: `count_work` (in
`shared.sol_count`) runs the reference on meta tensors, or on CPU when it needs values, or takes the
definition's optional `sol` formulas (`{"flops": "2 * M * N * K", "bytes": "..."}`, axis
expressions). `estimate` prices it on a `shared.hardware` row, in one of two modes:
- `ours`: matrix work at the tensor-core rate of its precision (the narrowest float dtype among the
  definition's inputs, the op's operands and any fp8/fp4 tensor the reference makes; fp32 at the
  TF32 rate unless told otherwise); compulsory bytes at the tensors' own dtypes; each ceiling the
  faster of the datasheet's and the measured one where the row carries both (`ceilings="fastest"`,
  so that no honest kernel beats T_sol; "measured" and "datasheet" price at one source only). Vector work (pointwise, reductions) is counted and timed at the FP32
  CUDA-core rate but bounds T_sol only on request: it is the reference's op count, not a minimum.
- `solar`: the conventions behind SOL-ExecBench's published `sol_ms` (NVlabs/SOLAR, leaderboard
  setup): tensor-core work only; every non-quantised problem at the 16-bit rate and 2 bytes per
  element (bool masks free), fp8 problems at the fp8 rate and 1 byte, nvfp4 at the fp4 rate and half
  a byte; fused bytes (inputs read and outputs written, intermediates free); plus the 0.4 us launch
  floor of the published table. With `hardware.B200_SOLAR_1500MHZ` it compares with their numbers.

The score, `S = 1 / (1 + (T_k - T_sol) / (T_b - T_sol))`: 0.5 when the kernel matches the baseline
T_b (the faster of eager and torch.compile), 1.0 at the hardware limit, towards 0 as it gets slower.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from shared.errors import UserError
from shared.hardware import B200_SOLAR_1500MHZ, HardwareSpec, Precision, lookup
from shared.schema import SolScore, load_problem
from shared.sol_bounded import CountLimits, CountRunner, count_workloads
from shared.sol_count import (
    DEFAULT_CPU_BUDGET_BYTES,
    SolCountError,
    WorkCount,
    count_work,
    input_precision,
    load_reference,
    solar_precision,
)

__all__ = [
    "DEFAULT_CPU_BUDGET_BYTES", "SOLAR_LAUNCH_FLOOR_MS", "Bound", "CampaignFigures", "ProblemOutcome",
    "ScoreValue", "SolCountError", "SolEstimate", "SolMode", "WorkCount", "baseline_ms", "campaign_figures",
    "count_work", "estimate", "geomean", "hack_floor_ms", "input_precision", "load_reference",
    "problem_score", "problem_speedup", "sol_score", "solar_precision", "trace_sol",
]

SOLAR_LAUNCH_FLOOR_MS = 0.0004  # added to every sol_ms of SOL-ExecBench's published table


class SolMode(str, Enum):
    OURS = "ours"
    SOLAR = "solar"


class Bound(str, Enum):
    """What limits T_sol."""

    MATRIX = "matrix"
    VECTOR = "vector"
    MEMORY = "memory"


# --- pricing ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SolEstimate:
    """T_sol of one workload on one hardware row, and how it was reached."""

    mode: SolMode
    hardware: str
    precision: Precision  # the rate the (largest share of) matrix work was priced at
    matrix_flops: int
    vector_flops: int
    bytes_moved: int
    t_matrix_ms: float
    t_vector_ms: float
    t_memory_ms: float
    floor_ms: float
    t_sol_ms: float
    bound: Bound
    bandwidth_gbps: float
    matrix_tflops: float
    ceilings: str  # how it was priced: "fastest" (of datasheet and measured), "measured" or "datasheet"
    counted_on: str

    def as_dict(self) -> dict[str, Any]:
        return {k: (v.value if isinstance(v, Enum) else v) for k, v in self.__dict__.items()}


CEILINGS = ("fastest", "measured", "datasheet")


def estimate(work: WorkCount, hardware: HardwareSpec, mode: SolMode | str = SolMode.OURS, *,
             ceilings: str = "fastest", fp32_matmul: Precision = Precision.TF32,
             include_vector: bool = False) -> SolEstimate:
    """Price `work` on `hardware`.

    `ours` (see the module docstring): `fp32_matmul` is the rate fp32 matrix work gets (TF32 by
    default; FP32 for the CUDA-core rate, BF16 to allow 16-bit math). Vector time is always
    reported; it bounds T_sol only with `include_vector`, because it is the reference's elementwise
    op count, which can exceed what a kernel needs (an fp4 quantisation emulated with masks, a
    causal mask built in memory) and T_sol must stay a lower bound.
    `ceilings`: each bandwidth and rate the faster of the datasheet's and the measured one
    ("fastest", the default: a measured ceiling below what a library kernel reaches would make
    T_sol no bound), or one source only ("measured", where measured; "datasheet").
    `solar`: SOL-ExecBench's conventions, datasheet (or SOLAR) ceilings only."""
    mode = SolMode(mode)
    if mode is SolMode.SOLAR:
        return _estimate_solar(work, hardware)
    if ceilings not in CEILINGS:
        raise ValueError(f"ceilings must be one of {', '.join(CEILINGS)}, not {ceilings!r}")

    def rate_of(precision: Precision) -> float:
        if ceilings == "fastest":
            return hardware.fastest_tflops(precision)
        return hardware.peak_tflops(precision, ceilings == "measured")

    bandwidth = (hardware.fastest_bandwidth_gbps() if ceilings == "fastest"
                 else hardware.bandwidth_gbps(ceilings == "measured"))
    t_matrix, dominant, dominant_rate = 0.0, work.input_precision, 0.0
    for precision, flops in sorted(work.matrix_flops.items(), key=lambda item: item[1]):
        priced = fp32_matmul if precision is Precision.FP32 else precision
        rate = rate_of(priced)
        t_matrix += flops / (rate * 1e9)
        dominant, dominant_rate = priced, rate
    t_vector = work.vector_flops / (rate_of(Precision.FP32) * 1e9)
    t_memory = work.bytes_moved / (bandwidth * 1e6)
    times = {Bound.MATRIX: t_matrix, Bound.MEMORY: t_memory}
    if include_vector:
        times[Bound.VECTOR] = t_vector
    bound = max(times, key=times.get)
    priced_at = ceilings if hardware.calibrated else "datasheet"
    return SolEstimate(SolMode.OURS, hardware.name, dominant, work.total_matrix_flops, work.vector_flops,
                       work.bytes_moved, t_matrix, t_vector, t_memory, 0.0, times[bound], bound,
                       bandwidth, dominant_rate or rate_of(dominant), priced_at, work.counted_on)


def hack_floor_ms(work: WorkCount, hardware: HardwareSpec) -> float:
    """The most permissive bound, for the reward-hack guard: matrix work at the fastest rate any
    kernel of the problem could use (fp32 at the 16-bit rate, as SOLAR argues), the larger of the
    datasheet and measured ceilings, no vector term. A time below it cannot be real.

    Memory: the compulsory reads, and only the writes that cannot fit the L2. The L2 is write-back:
    a kernel ends when its stores reach the L2, and up to the L2's capacity they go to DRAM after
    the timer stopped (torch's add of 4M fp32 elements on an H100 took 14.2 us, 3.53 TB/s of reads
    plus writes against a 3.35 TB/s datasheet; its reads alone, 2.4 TB/s). A part whose L2 the table
    does not know is charged its reads only."""
    t_matrix = sum(flops / (hardware.fastest_tflops(Precision.BF16 if p in (Precision.FP32, Precision.FP64) else p)
                            * 1e9) for p, flops in work.matrix_flops.items())
    bandwidth = hardware.fastest_bandwidth_gbps()
    deferred = work.write_bytes if hardware.l2_mib is None else min(work.write_bytes, int(hardware.l2_mib * 2**20))
    return max(t_matrix, (work.bytes_moved - deferred) / (bandwidth * 1e6))


_SOLAR_BYTES_PER_ELEMENT = {Precision.FP4: 0.5, Precision.FP8: 1.0, Precision.FP16: 2.0}


def _estimate_solar(work: WorkCount, hardware: HardwareSpec) -> SolEstimate:
    precision = work.solar_precision
    rate = hardware.peak_tflops(precision, use_measured=False)
    bandwidth = hardware.bandwidth_gbps(use_measured=False)
    elements = work.read_elements + work.write_elements - work.bool_elements
    moved = elements * _SOLAR_BYTES_PER_ELEMENT[precision]
    t_matrix = work.total_matrix_flops / (rate * 1e9)
    t_memory = moved / (bandwidth * 1e6)
    bound = Bound.MATRIX if t_matrix >= t_memory else Bound.MEMORY
    return SolEstimate(SolMode.SOLAR, hardware.name, precision, work.total_matrix_flops, 0, int(moved),
                       t_matrix, 0.0, t_memory, SOLAR_LAUNCH_FLOOR_MS,
                       max(t_matrix, t_memory) + SOLAR_LAUNCH_FLOOR_MS, bound, bandwidth, rate, "datasheet",
                       work.counted_on)


def describe_problem(problem_dir: Path, hardware: HardwareSpec, mode: SolMode | str = SolMode.OURS,
                     limits: CountLimits = CountLimits(), *, runner: CountRunner) -> list[dict]:
    """Per workload: FLOPs, bytes, bound and T_sol, or `t_sol_ms` None ("unknown") with the reason
    (`unknown`: memory, time, count or crash) and the message (`error`). Counted in a child
    process under `limits`, confined by `runner` (`shared.sol_bounded`)."""
    mode = SolMode(mode)
    problem = load_problem(Path(problem_dir), with_seeds=False)
    counted = count_workloads(problem.definition, problem.workloads, problem.root, runner=runner, limits=limits,
                              use_formulas=mode is SolMode.OURS)
    rows = []
    for workload, count in zip(problem.workloads, counted, strict=True):
        row: dict[str, Any] = {"uuid": workload.uuid, "axes": workload.axes, "peak_mb": count.peak_mb}
        if count.work is None:
            rows.append(row | {"t_sol_ms": None, "unknown": count.reason.value, "error": count.message})
        else:
            rows.append(row | estimate(count.work, hardware, mode).as_dict())
    return rows


def hardware_for(name: str, mode: SolMode | str, calibration: Path | None = None) -> HardwareSpec:
    """The row `name` (a row key, name, or torch device name), with measured ceilings from a
    calibration JSON (services.evaluator.calibrate's) when given; `solar` mode on the default
    H200 row takes SOLAR's B200 at 1500 MHz, the hardware SOL-ExecBench's figures are for."""
    if SolMode(mode) is SolMode.SOLAR and name == DEFAULT_HARDWARE:
        return B200_SOLAR_1500MHZ
    hardware = lookup(name)
    if calibration is not None:
        try:
            measured = json.loads(calibration.read_text())
            return hardware.with_calibration(measured["bandwidth_gbps"], measured["tflops"])
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise UserError(f"{calibration}: not a calibration JSON (bandwidth_gbps, tflops): {error}") from error
    return hardware


def report(problem_dir: Path, hardware: HardwareSpec, mode: SolMode | str, as_json: bool,
           limits: CountLimits = CountLimits(), *, runner: CountRunner) -> str:
    """T_sol per workload of the problem in `problem_dir`, as a table (with how many workloads were
    counted) or as JSON."""
    rows = describe_problem(problem_dir, hardware, mode, limits, runner=runner)
    if as_json:
        return json.dumps(rows, indent=2)
    label = "physical" if SolMode(mode) is SolMode.OURS else "solar"  # `kernelswarm sol --mode`'s names
    lines = [f"{problem_dir} on {hardware.name}{' (calibrated)' if hardware.calibrated else ''}, mode {label}",
             f"{'workload':38} {'matrix GFLOP':>12} {'MB':>10} {'bound':>7} {'T_sol ms':>10}"]
    for row in rows:
        label = ",".join(f"{k}={v}" for k, v in row["axes"].items())[:38]
        if row["t_sol_ms"] is None:
            lines.append(f"{label:38} T_sol unknown ({row['unknown']}): {row['error']}")
        else:
            lines.append(f"{label:38} {row['matrix_flops'] / 1e9:>12.3f} {row['bytes_moved'] / 1e6:>10.3f} "
                         f"{row['bound']:>7} {row['t_sol_ms']:>10.5f}")
    counted = sum(1 for row in rows if row["t_sol_ms"] is not None)
    lines.append(f"{counted} of {len(rows)} workloads counted")
    return "\n".join(lines)


DEFAULT_HARDWARE = "H200 SXM"


# --- score and campaign figures -----------------------------------------------------------------

@dataclass(frozen=True)
class ScoreValue:
    raw: float  # the formula's value; above 1 when T_k < T_sol, inf past its pole
    display: float  # clamped to [0, 1]; 1.0 whenever T_k <= T_sol
    degenerate: bool  # T_b <= T_sol: the formula has no gap to measure against


def sol_score(t_kernel_ms: float, t_baseline_ms: float, t_sol_ms: float) -> ScoreValue:
    """S = 1 / (1 + (T_k - T_sol) / (T_b - T_sol)).

    Anchors: S = 0.5 when T_k = T_b (as fast as the best PyTorch a user could write), S = 1.0 when
    T_k = T_sol (the hardware limit), S -> 0 as T_k grows. The raw value is kept: above 1.0 a kernel
    is faster than the model allows (the evaluator treats that as a reward hack).

    Degenerate case, T_b <= T_sol (the baseline is already at or past the modelled limit): there is
    no gap to close, and, as SOL-ExecBench does, the score is 1.0 if T_k <= T_sol, else 0.0.
    """
    if t_kernel_ms <= 0 or t_baseline_ms <= 0 or t_sol_ms < 0:
        raise ValueError(f"times must be positive: T_k={t_kernel_ms}, T_b={t_baseline_ms}, T_sol={t_sol_ms}")
    gap = t_baseline_ms - t_sol_ms
    if gap <= 0:
        value = 1.0 if t_kernel_ms <= t_sol_ms else 0.0
        return ScoreValue(value, value, True)
    denominator = (t_kernel_ms - t_sol_ms) + gap
    raw = gap / denominator if denominator > 0 else math.inf
    display = 1.0 if t_kernel_ms <= t_sol_ms else min(1.0, max(0.0, raw))
    return ScoreValue(raw, display, False)


def trace_sol(estimate_: SolEstimate, t_kernel_ms: float, t_baseline_ms: float) -> SolScore:
    """The trace's `evaluation.sol` block (displayed score)."""
    score = sol_score(t_kernel_ms, t_baseline_ms, estimate_.t_sol_ms)
    return SolScore(t_sol_ms=estimate_.t_sol_ms, t_baseline_ms=t_baseline_ms, score=score.display,
                    bound=estimate_.bound.value, hardware=estimate_.hardware)


def baseline_ms(eager_ms: float | None, compile_ms: float | None) -> float:
    """T_b: the faster of eager and torch.compile (either may be missing, not both)."""
    times = [t for t in (eager_ms, compile_ms) if t is not None and t > 0]
    if not times:
        raise ValueError("no baseline time: neither eager nor torch.compile was measured")
    return min(times)


def problem_score(workload_scores: Iterable[float]) -> float:
    """A problem's SOL score: the mean of its workloads' displayed scores."""
    values = list(workload_scores)
    if not values:
        raise ValueError("a problem score needs at least one workload score")
    return statistics.fmean(values)


def geomean(values: Iterable[float]) -> float:
    values = list(values)
    if not values or any(v <= 0 for v in values):
        raise ValueError("geomean needs positive values")
    return math.exp(statistics.fmean(math.log(v) for v in values))


def problem_speedup(t_reference_ms: Sequence[float], t_kernel_ms: Sequence[float]) -> float:
    """Geomean over a problem's workloads of T_reference / T_kernel."""
    return geomean(r / k for r, k in zip(t_reference_ms, t_kernel_ms, strict=True))


@dataclass(frozen=True)
class ProblemOutcome:
    """A problem's best result in a campaign; `None` fields: no passing kernel yet."""

    problem: str
    speedup_over_baseline: float | None  # problem_speedup against T_b
    speedup_over_eager: float | None
    sol_score: float | None


@dataclass(frozen=True)
class CampaignFigures:
    """The figures a campaign is judged by. Geomeans and the median are over solved problems;
    shares are over all problems (an unsolved problem beats nothing)."""

    problems: int
    solved: int
    geomean_speedup_over_baseline: float | None
    geomean_speedup_over_eager: float | None
    share_beating_baseline: float
    share_above_2x: float
    median_sol_score: float | None


def campaign_figures(outcomes: Sequence[ProblemOutcome]) -> CampaignFigures:
    over_b = [o.speedup_over_baseline for o in outcomes if o.speedup_over_baseline is not None]
    over_eager = [o.speedup_over_eager for o in outcomes if o.speedup_over_eager is not None]
    scores = [o.sol_score for o in outcomes if o.sol_score is not None]
    total = len(outcomes)
    return CampaignFigures(
        problems=total,
        solved=len(over_b),
        geomean_speedup_over_baseline=geomean(over_b) if over_b else None,
        geomean_speedup_over_eager=geomean(over_eager) if over_eager else None,
        share_beating_baseline=sum(s > 1.0 for s in over_b) / total if total else 0.0,
        share_above_2x=sum(s > 2.0 for s in over_b) / total if total else 0.0,
        median_sol_score=statistics.median(scores) if scores else None,
    )

"""Nsight Compute for the `profile` tool: the command that profiles the trusted replay target
(`target`), and its raw CSV page read into a compact text a model can read.

`ncu --page raw --csv` prints one header row of metric names, one row of their units, then one row
per profiled launch (the columns before the metrics name the launch: "ID", "Kernel Name", "Block
Size", "Grid Size", ...). The sections asked for (`SECTIONS`) decide which metrics are there; each
figure below is looked up by its raw name among a few known spellings (they differ between ncu
versions and GPUs), and a figure none of them gives is reported missing, never guessed.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from pathlib import Path

SECTIONS = ("SpeedOfLight", "MemoryWorkloadAnalysis", "ComputeWorkloadAnalysis", "Occupancy", "LaunchStats",
            "WarpStateStats")
MAX_LAUNCHES = 16  # profiled launches of one call at most (each is replayed once per metric pass)
TOP_STALLS = 4

# figure -> its raw names, first found wins
DURATION = ("gpu__time_duration.sum",)
DRAM_PCT = ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
            "dram__throughput.avg.pct_of_peak_sustained_elapsed")
DRAM_RATE = ("dram__bytes.sum.per_second",)
DRAM_BYTES = ("dram__bytes.sum",)
L2_PCT = ("lts__throughput.avg.pct_of_peak_sustained_elapsed",)
L2_RATE = ("lts__t_bytes.sum.per_second",)
MEMORY_PCT = ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",)
SM_PCT = ("sm__throughput.avg.pct_of_peak_sustained_elapsed",)
ACHIEVED_OCCUPANCY = ("sm__warps_active.avg.pct_of_peak_sustained_active",)
THEORETICAL_OCCUPANCY = ("sm__maximum_warps_per_active_cycle_pct",)
REGISTERS = ("launch__registers_per_thread",)
STATIC_SMEM = ("launch__shared_mem_per_block_static",)
DYNAMIC_SMEM = ("launch__shared_mem_per_block_dynamic",)
WAVES = ("launch__waves_per_multiprocessor",)
OCCUPANCY_LIMIT = re.compile(r"^launch__occupancy_limit_(?P<what>[a-z_]+)$")
TENSOR_PIPE = re.compile(r"^sm__(inst_executed_)?pipe_tensor[a-z0-9_]*\.avg\.pct_of_peak_sustained_active$")
# Stall reasons: WarpStateStats's per-issue ratios, or the older/other spellings; one family is used.
STALL_FAMILIES = (
    re.compile(r"^smsp__average_warps_issue_stalled_(?P<reason>[a-z0-9_]+?)_per_issue_active\.ratio$"),
    re.compile(r"^smsp__average_warp_latency_issue_stalled_(?P<reason>[a-z0-9_]+?)\.ratio$"),
    re.compile(r"^smsp__warp_issue_stalled_(?P<reason>[a-z0-9_]+?)_per_warp_active\.pct$"),
    re.compile(r"^smsp__pcsamp_warps_issue_stalled_(?P<reason>[a-z0-9_]+?)$"),
)
# Where none of those is there: any stall metric, its reason the words after `issue_stalled_`.
ANY_STALL = re.compile(r"^smsp__\w*issue_stalled_(?P<reason>[a-z0-9]+(?:_[a-z0-9]+)*?)(?:_per_[a-z_]+)?"
                       r"(?:\.(?:ratio|pct|sum|avg))*$")
NOT_STALLS = {"selected"}  # a warp issuing is no stall

_TIME_NS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9, "second": 1e9}
_SCALE = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}


@dataclass(frozen=True)
class Launch:
    """One profiled launch: its kernel, geometry and raw metrics (name -> (value, unit))."""
    kernel: str
    grid: str
    block: str
    metrics: dict[str, tuple[str, str]] = field(default_factory=dict)

    def number(self, names: tuple[str, ...]) -> float | None:
        for name in names:
            value = _number(self.metrics.get(name, ("", ""))[0])
            if value is not None:
                return value
        return None

    def unit(self, names: tuple[str, ...]) -> str:
        for name in names:
            if name in self.metrics and _number(self.metrics[name][0]) is not None:
                return self.metrics[name][1]
        return ""

    def duration_ns(self) -> float | None:
        value = self.number(DURATION)
        return None if value is None else value * _TIME_NS.get(self.unit(DURATION), 1.0)

    def rate_gbps(self, rate: tuple[str, ...], total: tuple[str, ...] = ()) -> float | None:
        """A throughput in GB/s: its per-second metric, else its byte count over the duration."""
        value = self.number(rate)
        if value is not None:
            return value * _unit_scale(self.unit(rate), "byte/second") / 1e9
        count, duration = self.number(total), self.duration_ns()
        if count is None or not duration:
            return None
        return count * _unit_scale(self.unit(total), "byte") / duration

    def matching(self, pattern: re.Pattern) -> dict[str, float]:
        """Metrics whose names match `pattern` (its first group, or the whole name) -> value."""
        found = {}
        for name, (value, _unit) in self.metrics.items():
            match = pattern.match(name)
            number = _number(value) if match else None
            if number is not None:
                found[match.groupdict().get("reason") or match.groupdict().get("what") or name] = number
        return found


def command(ncu: str, target: list[str], log_file: Path) -> list[str]:
    """ncu on `target` (the replay process), only inside its profiler range (`--profile-from-start
    off`), at the GPU's own clocks (`--clock-control none`, as the evaluator times), caches flushed
    before each launch's passes (`--cache-control all`, as the evaluator flushes L2)."""
    sections = [arg for name in SECTIONS for arg in ("--section", name)]
    return [ncu, "--profile-from-start", "off", "--clock-control", "none", "--cache-control", "all",
            "--launch-count", str(MAX_LAUNCHES), *sections, "--page", "raw", "--csv", "--print-units", "base",
            "--log-file", str(log_file), *target]


def parse(text: str) -> list[Launch]:
    """The launches of a raw CSV page (anything before its header row, ncu's own ==PROF== lines, is
    skipped). Raises ValueError where no header row is found."""
    start = text.find('"ID"')
    if start < 0:
        raise ValueError("no raw CSV page in ncu's output")
    rows = list(csv.reader(io.StringIO(text[start:])))
    header, body = rows[0], [r for r in rows[1:] if r]
    units = body.pop(0) if body and not body[0][0].strip().isdigit() else [""] * len(header)
    launches = []
    for row in body:
        record = dict(zip(header, row))
        if not record.get("ID", "").strip().isdigit():
            continue
        metrics = {name: (record.get(name, ""), unit) for name, unit in zip(header, units) if "__" in name}
        launches.append(Launch(record.get("Kernel Name", "?"), record.get("Grid Size", "?"),
                               record.get("Block Size", "?"), metrics))
    return launches


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", "").strip())
    except (ValueError, AttributeError):
        return None


def _unit_scale(unit: str, base: str) -> float:
    """The factor from `unit` to `base` ("Gbyte/second" -> 1e9 for "byte/second"); 1 if unknown."""
    unit = unit.strip()
    if unit.endswith(base):
        return _SCALE.get(unit[: -len(base)], 1.0)
    return 1.0


DETAILED = 4  # launches shown in full (the longest); the others get one line each


def summary(launches: list[Launch], dram_peak_gbps: float | None = None) -> str:
    """The text the writer reads: the call's kernel time, then per launch (longest first) its
    duration, DRAM and L2 bandwidth against the peak, SM and tensor-pipe throughput, occupancy and
    what limits it, its resources and its top warp stall reasons; what ncu did not give is named."""
    if not launches:
        return "ncu profiled no kernel launch (the call launched none inside the profiled range)"
    durations = [launch.duration_ns() for launch in launches]
    known = [d for d in durations if d is not None]
    total = f"{sum(known) / 1e6:.4g} ms of kernel time" if known else "kernel time missing (gpu__time_duration)"
    lines = [f"one call: {len(launches)} launch{'es' if len(launches) != 1 else ''}, {total}"
             + (f" (the first {MAX_LAUNCHES} launches only)" if len(launches) >= MAX_LAUNCHES else "")]
    order = sorted(range(len(launches)), key=lambda i: -(durations[i] or 0.0))
    for rank, index in enumerate(order):
        launch = launches[index]
        if rank >= DETAILED:
            lines.append(f"launch {index}: {launch.kernel} grid {launch.grid} block {launch.block}: "
                         f"{_ms(durations[index])}")
            continue
        lines.extend(_detail(index, launch, durations[index], dram_peak_gbps))
    return "\n".join(lines)


def _detail(index: int, launch: Launch, duration_ns: float | None, dram_peak_gbps: float | None) -> list[str]:
    missing: list[str] = []

    def pct(label: str, names: tuple[str, ...]) -> str | None:
        value = launch.number(names)
        if value is None:
            missing.append(label)
            return None
        return f"{label} {value:.1f}%"

    dram_rate, l2_rate = launch.rate_gbps(DRAM_RATE, DRAM_BYTES), launch.rate_gbps(L2_RATE)
    dram = pct("DRAM", DRAM_PCT)
    if dram and dram_rate is not None:
        dram += f" ({dram_rate:.0f}" + (f" of {dram_peak_gbps:.0f} GB/s)" if dram_peak_gbps else " GB/s)")
    l2 = pct("L2", L2_PCT)
    if l2 and l2_rate is not None:
        l2 += f" ({l2_rate:.0f} GB/s)"
    tensor = launch.matching(TENSOR_PIPE)
    throughput = [dram, l2, pct("memory", MEMORY_PCT), pct("SM", SM_PCT),
                  f"tensor pipe {max(tensor.values()):.1f}%" if tensor else None]
    if not tensor:
        missing.append("tensor pipe")
    lines = [f"launch {index}: {launch.kernel} grid {launch.grid} block {launch.block}: {_ms(duration_ns)}",
             "  throughput (% of peak): " + (", ".join(t for t in throughput if t) or "none reported")]
    lines.append("  occupancy: " + _occupancy(launch, missing))
    resources = [f"{v:{form}} {label}" for label, names, form in (
        ("registers/thread", REGISTERS, ".0f"), ("B static smem/block", STATIC_SMEM, ".0f"),
        ("B dynamic smem/block", DYNAMIC_SMEM, ".0f"), ("waves/SM", WAVES, ".1f"))
        if (v := launch.number(names)) is not None]
    if resources:
        lines.append("  launch: " + ", ".join(resources))
    lines.append("  " + _stalls(launch, missing))
    if missing:
        lines.append("  not reported by ncu here: " + ", ".join(missing))
    return lines


def _occupancy(launch: Launch, missing: list[str]) -> str:
    achieved, theoretical = launch.number(ACHIEVED_OCCUPANCY), launch.number(THEORETICAL_OCCUPANCY)
    parts = [f"achieved {achieved:.1f}%" if achieved is not None else None,
             f"theoretical {theoretical:.1f}%" if theoretical is not None else None]
    if achieved is None:
        missing.append("achieved occupancy")
    if theoretical is None:
        missing.append("theoretical occupancy")
    limits = {what: value for what, value in launch.matching(OCCUPANCY_LIMIT).items()}
    if limits:
        limiter = min(limits, key=lambda what: limits[what])
        shown = ", ".join(f"{what} {value:.0f}" for what, value in sorted(limits.items(), key=lambda kv: kv[1]))
        parts.append(f"limited by {limiter} (blocks/SM each resource allows: {shown})")
    else:
        missing.append("occupancy limits")
    return ", ".join(p for p in parts if p) or "none reported"


def _stalls(launch: Launch, missing: list[str]) -> str:
    """The top stall reasons as shares of all stall reasons of one family of metrics (the one that
    names the most reasons): unit-free, so any family reads alike."""
    best: dict[str, float] = {}
    for family in STALL_FAMILIES:
        found = {r: v for r, v in launch.matching(family).items() if r not in NOT_STALLS and v > 0}
        if len(found) > len(best):
            best = found
    if not best:
        best = {r: v for r, v in launch.matching(ANY_STALL).items() if r not in NOT_STALLS and v > 0}
    total = sum(best.values())
    if not total:
        missing.append("warp stall reasons")
        return "warp stalls: none reported"
    top = sorted(best.items(), key=lambda kv: -kv[1])[:TOP_STALLS]
    return "top warp stalls (share of stall cycles): " + ", ".join(f"{r} {100 * v / total:.0f}%" for r, v in top)


def _ms(duration_ns: float | None) -> str:
    return f"{duration_ns / 1e6:.4g} ms" if duration_ns is not None else "duration missing"

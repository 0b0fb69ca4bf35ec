"""Measure the GPU's own ceilings: DRAM copy bandwidth and matmul rate per dtype.

    python -m services.evaluator.calibrate --out calibration.json

An evaluator runs this once at start and stores the result in `calibrations` (`bandwidth_gbps`,
`tflops_json` keyed by torch dtype name); `shared.hardware.HardwareSpec.with_calibration` puts
the measured ceilings next to the datasheet ones, and the SOL model uses them where present.

- Bandwidth: one large device-to-device copy (2 GiB by default, far beyond L2), bytes read plus
  bytes written over the time of one copy; the median of the timed copies.
- Matmul: 8192^3 products of random matrices (bf16, fp16, and fp8 e4m3 through `torch._scaled_mm`
  where the GPU has fp8 tensor cores): 2 n^3 FLOPs over the median time.

Each timed run is bracketed by CUDA events after warm-up runs. Nothing but torch is needed. The
same functions run on a CPU device (with `time.perf_counter`), which is how they are tested.

`ensure` is what the evaluator service calls at start (`tasks.py`, GPU devices, setting
`calibrate`): the newest calibration of its GPU kind younger than `MAX_AGE` when the database has
one, else a new one measured in a child process (an idle GPU: no attempt runs before it ends) and
stored. `stored` is what an attempt reads (`record.py`) to price T_sol with the measured ceilings.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

from sqlalchemy import select

from shared.db import CalibrationRow, Database
from shared.hardware import HardwareSpec, UnknownHardwareError, cpu_name, lookup

log = logging.getLogger(__name__)
MAX_AGE = timedelta(days=7)  # a stored calibration older than this is measured again at start
CHILD_TIMEOUT_S = 600.0

DEFAULT_COPY_BYTES = 2 << 30
DEFAULT_MATMUL_N = 8192
DEFAULT_REPEATS = 20
WARMUP = 3
MATMUL_DTYPES = ("bfloat16", "float16", "float8_e4m3fn")
GPU_DEFAULTS = {"copy_bytes": DEFAULT_COPY_BYTES, "matmul_n": DEFAULT_MATMUL_N, "repeats": DEFAULT_REPEATS,
                "dtypes": MATMUL_DTYPES}
# A CPU evaluator has no datasheet row: T_sol is priced at these alone. fp32 is the rate its vector
# work is priced at; 256 MiB copies are beyond any CPU's last-level cache.
CPU_DEFAULTS = {"copy_bytes": 256 << 20, "matmul_n": 1024, "repeats": 7, "dtypes": ("float32", "bfloat16")}


@dataclass(frozen=True)
class Calibration:
    """Measured ceilings of one device. `tflops` is keyed by torch dtype name."""

    hardware: str
    bandwidth_gbps: float
    tflops: Mapping[str, float]
    measured_at: str
    torch_version: str
    settings: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    skipped: tuple[str, ...] = ()  # what could not be measured, and why

    @property
    def tflops_json(self) -> str:
        """The `calibrations.tflops_json` column."""
        return json.dumps(dict(self.tflops), sort_keys=True)

    def as_json(self) -> dict[str, Any]:
        return {"hardware": self.hardware, "bandwidth_gbps": self.bandwidth_gbps, "tflops": dict(self.tflops),
                "measured_at": self.measured_at, "torch_version": self.torch_version,
                "settings": dict(self.settings), "skipped": list(self.skipped)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Calibration:
        return cls(data["hardware"], float(data["bandwidth_gbps"]), MappingProxyType(dict(data["tflops"])),
                   data["measured_at"], data["torch_version"], MappingProxyType(dict(data.get("settings", {}))),
                   tuple(data.get("skipped", ())))

    def apply_to(self, spec: HardwareSpec) -> HardwareSpec:
        """The datasheet row with these measured ceilings attached."""
        return spec.with_calibration(self.bandwidth_gbps, self.tflops)

    def as_spec(self) -> HardwareSpec | None:
        """A row of these measurements alone, for a device without a datasheet row (a CPU); None
        without an fp32 rate to price vector work at."""
        try:
            return HardwareSpec.measured_only(self.hardware, self.bandwidth_gbps, self.tflops)
        except ValueError:
            return None


def time_ms(run: Callable[[], Any], device: torch.device, repeats: int, warmup: int = WARMUP) -> list[float]:
    """Wall time of each of `repeats` calls after `warmup` untimed ones (CUDA events on a GPU)."""
    for _ in range(warmup):
        run()
    _synchronize(device)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            started = time.perf_counter()
            run()
            times.append((time.perf_counter() - started) * 1e3)
    return times


def measure_copy_bandwidth(device: torch.device, nbytes: int = DEFAULT_COPY_BYTES,
                           repeats: int = DEFAULT_REPEATS) -> float:
    """GB/s (1e9 B/s) of a device-to-device copy of `nbytes`, counting the read and the write."""
    source = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 256)
    target = torch.empty_like(source)
    median_ms = statistics.median(time_ms(lambda: target.copy_(source), device, repeats))
    return bandwidth_gbps(2 * nbytes, median_ms)


def measure_matmul_tflops(device: torch.device, dtype: torch.dtype, n: int = DEFAULT_MATMUL_N,
                          repeats: int = DEFAULT_REPEATS) -> float:
    """TFLOP/s of an n x n x n matmul in `dtype` (fp8: `torch._scaled_mm`, bf16 output)."""
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, generator=generator)
    b = torch.randn(n, n, device=device, generator=generator)
    if dtype.itemsize == 1:
        a8, b8 = a.to(dtype), b.to(dtype).t()  # _scaled_mm wants the second operand column-major
        one = torch.ones((), device=device)
        del a, b

        def run() -> torch.Tensor:
            return torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    else:
        a, b = a.to(dtype), b.to(dtype)

        def run() -> torch.Tensor:
            return torch.mm(a, b)
    median_ms = statistics.median(time_ms(run, device, repeats))
    return matmul_tflops(n, median_ms)


def bandwidth_gbps(bytes_moved: int, ms: float) -> float:
    return bytes_moved / (ms * 1e6)


def matmul_tflops(n: int, ms: float) -> float:
    return 2 * n**3 / (ms * 1e9)


def calibrate(device: torch.device | str = "cuda", *, copy_bytes: int | None = None,
              matmul_n: int | None = None, repeats: int | None = None,
              dtypes: tuple[str, ...] | None = None) -> Calibration:
    """Measure bandwidth and the matmul rate of each dtype the device supports. Unset sizes take the
    device's defaults: on a CPU smaller ones (`CPU_DEFAULTS`, seconds in all on two cores)."""
    device = torch.device(device)
    defaults = CPU_DEFAULTS if device.type == "cpu" else GPU_DEFAULTS
    copy_bytes = defaults["copy_bytes"] if copy_bytes is None else copy_bytes
    matmul_n = defaults["matmul_n"] if matmul_n is None else matmul_n
    repeats = defaults["repeats"] if repeats is None else repeats
    dtypes = defaults["dtypes"] if dtypes is None else dtypes
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
    bandwidth = measure_copy_bandwidth(device, copy_bytes, repeats)
    rates: dict[str, float] = {}
    skipped: list[str] = []
    for name in dtypes:
        dtype = getattr(torch, name)
        reason = _unsupported(device, dtype)
        if reason:
            skipped.append(f"{name}: {reason}")
            continue
        rates[name] = measure_matmul_tflops(device, dtype, matmul_n, repeats)
        _release(device)
    return Calibration(
        hardware=device_name(device), bandwidth_gbps=bandwidth, tflops=MappingProxyType(rates),
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), torch_version=torch.__version__,
        settings=MappingProxyType({"copy_bytes": copy_bytes, "matmul_n": matmul_n, "repeats": repeats,
                                   "warmup": WARMUP, "statistic": "median"}),
        skipped=tuple(skipped))


def device_name(device: torch.device) -> str:
    """The name attempts record as their hardware (`evaluate.environment`): what a calibration is
    stored and found under."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU {cpu_name()}"


def _unsupported(device: torch.device, dtype: torch.dtype) -> str | None:
    if dtype.itemsize != 1:
        return None
    if device.type != "cuda":
        return "fp8 matmul is measured on CUDA devices only"
    if torch.cuda.get_device_capability(device) < (8, 9):
        return "no fp8 tensor cores before compute capability 8.9"
    return None


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def format_table(calibration: Calibration, spec: HardwareSpec | None = None) -> str:
    """Measured ceilings, next to the datasheet row when there is one."""
    lines = [f"calibration of {calibration.hardware} (torch {calibration.torch_version}, "
             f"{calibration.measured_at})",
             f"{'ceiling':24} {'measured':>12} {'datasheet':>12} {'ratio':>7}"]
    rows = [("copy bandwidth GB/s", calibration.bandwidth_gbps, spec.dram_gbps if spec else None)]
    rows += [(f"{name} matmul TFLOP/s", value, spec.peak_tflops(name, use_measured=False) if spec else None)
             for name, value in calibration.tflops.items()]
    for label, measured, sheet in rows:
        ratio = f"{measured / sheet:>7.2f}" if sheet else f"{'':>7}"
        sheet_text = f"{sheet:>12.1f}" if sheet else f"{'-':>12}"
        lines.append(f"{label:24} {measured:>12.4g} {sheet_text} {ratio}")
    lines += [f"skipped: {reason}" for reason in calibration.skipped]
    return "\n".join(lines)


def stored(db: Database, hardware: str, max_age: timedelta | None = None) -> Calibration | None:
    """The newest calibration of `hardware` (torch's device name), if younger than `max_age`."""
    with db.session() as session:
        row = session.scalars(select(CalibrationRow).where(CalibrationRow.hardware == hardware)
                              .order_by(CalibrationRow.measured_at.desc(), CalibrationRow.id.desc()).limit(1)).first()
        if row is None:
            return None
        measured_at = row.measured_at if row.measured_at.tzinfo else row.measured_at.replace(tzinfo=timezone.utc)
        if max_age is not None and datetime.now(timezone.utc) - measured_at > max_age:
            return None
        return Calibration(row.hardware, row.bandwidth_gbps, MappingProxyType(json.loads(row.tflops_json)),
                           measured_at.isoformat(timespec="seconds"), "")


def store(db: Database, calibration: Calibration) -> None:
    with db.session() as session:
        session.add(CalibrationRow(hardware=calibration.hardware, bandwidth_gbps=calibration.bandwidth_gbps,
                                   tflops_json=calibration.tflops_json,
                                   measured_at=datetime.fromisoformat(calibration.measured_at)
                                   .astimezone(timezone.utc).replace(tzinfo=None)))


def measure_in_child(device: str) -> Calibration:
    """`python -m services.evaluator.calibrate` in a process of its own: its memory goes with it."""
    with tempfile.TemporaryDirectory(prefix="ks-calibration-") as folder:
        out = Path(folder) / "calibration.json"
        done = subprocess.run([sys.executable, "-m", "services.evaluator.calibrate", "--device", device, "--out",
                               str(out)], capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"calibration exited {done.returncode}: {(done.stderr or done.stdout)[-1500:]}")
        return Calibration.from_json(json.loads(out.read_text()))


def ensure(db: Database, device: str, hardware: str,
           measure: Callable[[str], Calibration] = measure_in_child) -> Calibration | None:
    """A calibration of `hardware` no older than MAX_AGE: the stored one, else measured now and
    stored. None when a GPU has no datasheet row to attach it to, or the measurement failed (the
    datasheet ceilings then price T_sol, as before; a CPU then has none). A CPU has no row: its
    calibration is all its T_sol is priced at (`Calibration.as_spec`)."""
    if device.startswith("cuda"):
        try:
            lookup(hardware)
        except UnknownHardwareError:
            log.info("no calibration: %s has no row in the hardware table", hardware)
            return None
    found = stored(db, hardware, MAX_AGE)
    if found is not None:
        return found
    started = time.monotonic()
    try:
        calibration = measure(device)
    except Exception:
        log.exception("calibration of %s failed: T_sol stays on the datasheet ceilings", hardware)
        return None
    store(db, calibration)
    log.info("calibrated %s in %.0f s: %.0f GB/s, %s TFLOP/s", hardware, time.monotonic() - started,
             calibration.bandwidth_gbps, {k: round(v) for k, v in calibration.tflops.items()})
    return calibration


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.evaluator.calibrate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--copy-mib", type=int, default=None, help="default: 2048 on a GPU, 256 on a CPU")
    parser.add_argument("--matmul-n", type=int, default=None, help="default: 8192 on a GPU, 1024 on a CPU")
    parser.add_argument("--repeats", type=int, default=None, help="default: 20 on a GPU, 7 on a CPU")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: pass --device cpu to try the measurements on the CPU", file=sys.stderr)
        return 2
    calibration = calibrate(args.device, copy_bytes=None if args.copy_mib is None else args.copy_mib << 20,
                            matmul_n=args.matmul_n, repeats=args.repeats)
    try:
        spec = lookup(calibration.hardware)
    except UnknownHardwareError:
        spec = None
    print(format_table(calibration, spec))
    args.out.write_text(json.dumps(calibration.as_json(), indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

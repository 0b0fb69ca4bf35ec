"""The hardware table: dense peak throughput per precision and DRAM bandwidth, per GPU.

Every row names the document its numbers come from. Tensor-core figures are *dense*: NVIDIA's
datasheets print them with 2:4 structured sparsity (marked "*"), so the table holds half of the
printed value. `fp64` is the FP64 Tensor Core rate where the part has one (the rate a matmul can
reach), `fp32` the CUDA-core (non-tensor) FP32 rate, `tf32`/`bf16`/`fp16`/`fp8`/`fp4` the tensor-core
rates with FP32 accumulation. A precision the part lacks is `None`.

An evaluator measures its own ceilings at start (`services/evaluator/calibrate.py`);
`HardwareSpec.with_calibration` attaches them to the datasheet row. Both are kept: the SOL model
uses the measured value where there is one (`use_measured=True`) and says which one it used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from types import MappingProxyType
from typing import Mapping


class Precision(str, Enum):
    """The rate classes a peak is given for, narrowest last."""

    FP64 = "fp64"
    FP32 = "fp32"
    TF32 = "tf32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    FP4 = "fp4"


# Calibration results and the `calibrations` table key rates by torch dtype name.
_PRECISION_ALIASES: dict[str, Precision] = {
    "float64": Precision.FP64, "double": Precision.FP64,
    "float32": Precision.FP32, "float": Precision.FP32,
    "tf32": Precision.TF32, "tensorfloat32": Precision.TF32,
    "bfloat16": Precision.BF16,
    "float16": Precision.FP16, "half": Precision.FP16,
    "float8_e4m3fn": Precision.FP8, "float8_e5m2": Precision.FP8, "float8": Precision.FP8,
    "float4_e2m1fn_x2": Precision.FP4, "float4_e2m1": Precision.FP4, "nvfp4": Precision.FP4,
}

# When a part lacks a precision, the rate a kernel would actually use instead.
_FALLBACK: dict[Precision, Precision] = {
    Precision.FP4: Precision.FP8,
    Precision.FP8: Precision.BF16,
    Precision.FP64: Precision.FP32,
}


def as_precision(value: Precision | str) -> Precision:
    """`Precision`, its value (`"bf16"`) or a torch dtype name (`"bfloat16"`, `"torch.float8_e4m3fn"`)."""
    if isinstance(value, Precision):
        return value
    key = str(value).lower().removeprefix("torch.")
    try:
        return Precision(key)
    except ValueError:
        pass
    try:
        return _PRECISION_ALIASES[key]
    except KeyError:
        raise ValueError(f"unknown precision {value!r}") from None


@dataclass(frozen=True)
class Peaks:
    """Dense peak TFLOP/s per precision; `None` where the part has no such rate."""

    fp64: float | None
    fp32: float
    tf32: float | None
    bf16: float | None
    fp16: float | None
    fp8: float | None = None
    fp4: float | None = None

    def get(self, precision: Precision) -> float | None:
        return getattr(self, precision.value)

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


class UnknownHardwareError(KeyError):
    """No row of the table matches the device name."""


@dataclass(frozen=True)
class HardwareSpec:
    """One GPU: datasheet ceilings plus, once calibrated, the measured ones."""

    key: str
    name: str
    dram_gbps: float
    peaks: Peaks
    source: str
    torch_names: tuple[str, ...] = ()
    measured_bandwidth_gbps: float | None = None
    measured_tflops: Mapping[Precision, float] = field(default_factory=lambda: MappingProxyType({}))
    l2_mib: float | None = None  # L2 capacity (MiB): writes up to it can still be in flight when a kernel ends
    # False for a row made of an evaluator's own measurements (`measured_only`: a CPU): its
    # ceilings price T_sol, but no physical floor is drawn from them (caches beat a measured copy).
    datasheet: bool = True

    def bandwidth_gbps(self, use_measured: bool = True) -> float:
        """DRAM bandwidth in GB/s (1e9 bytes per second)."""
        if use_measured and self.measured_bandwidth_gbps:
            return self.measured_bandwidth_gbps
        return self.dram_gbps

    def peak_tflops(self, precision: Precision | str, use_measured: bool = True) -> float:
        """Peak dense TFLOP/s for `precision`; a precision the part lacks takes the rate a kernel
        would use instead (fp4 -> fp8 -> bf16, fp64 -> fp32)."""
        wanted = as_precision(precision)
        current: Precision | None = wanted
        while current is not None:
            if use_measured and current in self.measured_tflops:
                return self.measured_tflops[current]
            value = self.peaks.get(current)
            if value:
                return value
            current = _FALLBACK.get(current)
        raise ValueError(f"{self.name} has no rate for {wanted.value}")

    def fastest_bandwidth_gbps(self) -> float:
        """The larger of the datasheet's and the measured DRAM bandwidth (what T_sol is priced at)."""
        return max(self.bandwidth_gbps(False), self.bandwidth_gbps(True))

    def fastest_tflops(self, precision: Precision | str) -> float:
        """The larger of the datasheet's and the measured rate for `precision` (what T_sol is priced
        at: cuBLAS runs an H200's bf16 GEMM at about 813 TFLOP/s, above a calibration's 772)."""
        return max(self.peak_tflops(precision, False), self.peak_tflops(precision, True))

    def peak_source(self, precision: Precision | str, use_measured: bool = True) -> str:
        """`"measured"` or `"datasheet"`: where `peak_tflops` took its number from."""
        wanted = as_precision(precision)
        current: Precision | None = wanted
        while current is not None:
            if use_measured and current in self.measured_tflops:
                return "measured"
            if self.peaks.get(current):
                return "datasheet"
            current = _FALLBACK.get(current)
        return "datasheet"

    @property
    def calibrated(self) -> bool:
        return self.measured_bandwidth_gbps is not None or bool(self.measured_tflops)

    @classmethod
    def measured_only(cls, name: str, bandwidth_gbps: float, tflops_by_dtype: Mapping[str | Precision, float]
                      ) -> HardwareSpec:
        """A row for a device without a datasheet row (a CPU), made of what its evaluator measured
        at start: memory bandwidth and matmul rates (`fp32` the rate vector work is priced at)."""
        measured = {as_precision(k): float(v) for k, v in tflops_by_dtype.items() if v}
        if Precision.FP32 not in measured:
            raise ValueError(f"a measured row for {name} needs an fp32 rate, not only {sorted(measured)}")
        fp32 = measured[Precision.FP32]
        bf16 = measured.get(Precision.BF16) or fp32
        # Every precision has a rate, the nearest measured one (a CPU has no tensor cores: tf32 runs at
        # fp32, fp16 at bf16's rate or fp32's), so no workload's dtype leaves T_sol without a price.
        peaks = Peaks(fp64=fp32, fp32=fp32, tf32=fp32, bf16=bf16, fp16=measured.get(Precision.FP16) or bf16,
                      fp8=bf16, fp4=bf16)
        return cls("measured", name, bandwidth_gbps, peaks, "measured by the evaluator at start (no datasheet)",
                   measured_bandwidth_gbps=bandwidth_gbps, measured_tflops=MappingProxyType(measured),
                   datasheet=False)

    def with_calibration(self, bandwidth_gbps: float | None,
                         tflops_by_dtype: Mapping[str | Precision, float]) -> HardwareSpec:
        """A copy carrying measured ceilings (keys: `Precision`, `"bf16"` or `"bfloat16"`); the
        datasheet numbers stay in `dram_gbps` and `peaks`."""
        measured = {as_precision(k): float(v) for k, v in tflops_by_dtype.items() if v}
        return replace(self, measured_bandwidth_gbps=bandwidth_gbps,
                       measured_tflops=MappingProxyType(measured))


def _row(key: str, name: str, dram_gbps: float, peaks: Peaks, source: str,
         torch_names: tuple[str, ...], l2_mib: float | None = None) -> HardwareSpec:
    return HardwareSpec(key, name, dram_gbps, peaks, source, torch_names, l2_mib=l2_mib)


H100_SXM = _row(
    "h100_sxm", "H100 SXM", 3350.0,
    Peaks(fp64=67.0, fp32=67.0, tf32=494.5, bf16=989.5, fp16=989.5, fp8=1979.0),
    "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column; tensor rates printed with sparsity, halved)",
    ("h100 80gb hbm3", "h100 sxm", "h100-sxm5-80gb", "h100 sxm5"),
    l2_mib=50.0,  # NVIDIA H100 Tensor Core GPU Architecture whitepaper: 50 MB L2 (H100 SXM5)
)
H200_SXM = _row(
    "h200_sxm", "H200 SXM", 4800.0,
    Peaks(fp64=67.0, fp32=67.0, tf32=494.5, bf16=989.5, fp16=989.5, fp8=1979.0),
    "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column; tensor rates printed with sparsity, halved)",
    ("h200", "h200 sxm", "h200 141gb hbm3e"),
    l2_mib=50.0,  # the same GH100 die as the H100 SXM5
)
B200 = _row(
    "b200", "B200", 7700.0,
    Peaks(fp64=37.0, fp32=75.0, tf32=1100.0, bf16=2250.0, fp16=2250.0, fp8=4500.0, fp4=9000.0),
    "NVIDIA HGX B200 datasheet, individual Blackwell GPU (HGX B200) column; tensor rates printed "
    "with sparsity, halved",
    ("b200",),
)
A100_SXM = _row(
    "a100_sxm", "A100 SXM 80GB", 2039.0,
    Peaks(fp64=19.5, fp32=19.5, tf32=156.0, bf16=312.0, fp16=312.0),
    "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM column; dense figures)",
    ("a100-sxm4-80gb", "a100 sxm4 80gb", "a100 sxm"),
)
A100_SXM_40GB = _row(
    "a100_sxm_40gb", "A100 SXM 40GB", 1555.0,
    Peaks(fp64=19.5, fp32=19.5, tf32=156.0, bf16=312.0, fp16=312.0),
    "NVIDIA A100 Tensor Core GPU datasheet (A100 40GB SXM column; dense figures)",
    ("a100-sxm4-40gb", "a100 sxm4 40gb"),
)
L40S = _row(
    "l40s", "L40S", 864.0,
    Peaks(fp64=None, fp32=91.6, tf32=183.0, bf16=366.5, fp16=366.5, fp8=733.0),
    "NVIDIA L40S datasheet (tensor rates printed with sparsity, halved; no FP64 figure given)",
    ("l40s",),
)
RTX_4090 = _row(
    "rtx_4090", "GeForce RTX 4090", 1008.0,
    Peaks(fp64=None, fp32=82.6, tf32=82.6, bf16=165.2, fp16=165.2, fp8=330.3),
    "NVIDIA Ada Lovelace GPU architecture whitepaper, GeForce RTX 4090 table (dense, FP32 "
    "accumulate: the FP16-accumulate rate is twice that)",
    ("geforce rtx 4090", "rtx 4090"),
)
# SOL-ExecBench's published B200 figures come from SOLAR's arch config with the SM clock locked
# at 1500 MHz: MAC/cycle x 2 x 1.5 GHz, DRAM 5111.6 B/cycle x 1.5 GHz. Only `solar` mode uses it.
B200_SOLAR_1500MHZ = _row(
    "b200_solar_1500mhz", "B200 @ 1500 MHz (SOLAR)", 7667.4,
    Peaks(fp64=None, fp32=120.753, tf32=905.625, bf16=1811.253, fp16=1811.253, fp8=3622.503,
          fp4=7245.0),
    "NVlabs/SOLAR configs/arch/B200.yaml (per-cycle rates at freq_GHz 1.5), the setup of "
    "SOL-ExecBench's leaderboard (configs/execbench/leaderboard_b200.yaml)",
    (),
)

TABLE: tuple[HardwareSpec, ...] = (H100_SXM, H200_SXM, B200, A100_SXM, A100_SXM_40GB, L40S, RTX_4090,
                                   B200_SOLAR_1500MHZ)


def _normalise(name: str) -> str:
    text = name.lower().replace("_", " ").strip()
    text = re.sub(r"^nvidia\s+", "", text)
    return re.sub(r"\s+", " ", text)


def lookup(name: str) -> HardwareSpec:
    """The row for a device: torch's name (`torch.cuda.get_device_name()`, e.g. "NVIDIA H200",
    "NVIDIA H100 80GB HBM3", "NVIDIA B200"), a row key ("h200_sxm") or a row name ("H200 SXM").
    Variants with other ceilings (PCIe, NVL) are not matched: `UnknownHardwareError`."""
    wanted = _normalise(name)
    for spec in TABLE:
        if wanted in (spec.key.replace("_", " "), _normalise(spec.name)) or wanted in spec.torch_names:
            return spec
    raise UnknownHardwareError(
        f"no hardware row for {name!r}; known: {', '.join(s.name for s in TABLE)}")


def cpu_name() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else what `platform` knows."""
    import platform
    from pathlib import Path

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()

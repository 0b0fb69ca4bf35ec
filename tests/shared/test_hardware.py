"""shared.hardware: the table's rows, lookup by torch's device names, measured ceilings beside the
datasheet ones."""

from __future__ import annotations

import pytest

from shared.hardware import (
    A100_SXM,
    B200,
    B200_SOLAR_1500MHZ,
    H100_SXM,
    H200_SXM,
    L40S,
    RTX_4090,
    TABLE,
    Precision,
    UnknownHardwareError,
    as_precision,
    lookup,
)


@pytest.mark.parametrize(("torch_name", "row"), [
    ("NVIDIA H200", H200_SXM),
    ("NVIDIA H100 80GB HBM3", H100_SXM),
    ("NVIDIA B200", B200),
    ("NVIDIA A100-SXM4-80GB", A100_SXM),
    ("NVIDIA L40S", L40S),
    ("NVIDIA GeForce RTX 4090", RTX_4090),
    ("h200_sxm", H200_SXM),
    ("H200 SXM", H200_SXM),
    ("B200 @ 1500 MHz (SOLAR)", B200_SOLAR_1500MHZ),
])
def test_lookup_matches_torch_device_names_and_row_keys(torch_name, row):
    assert lookup(torch_name) is row


@pytest.mark.parametrize("name", ["NVIDIA H100 PCIe", "NVIDIA H200 NVL", "Tesla T4", ""])
def test_variants_with_other_ceilings_are_not_matched(name):
    with pytest.raises(UnknownHardwareError, match="no hardware row"):
        lookup(name)


def test_every_row_names_its_source_and_has_dense_16_bit_rates():
    for row in TABLE:
        assert row.source and row.dram_gbps > 0
        assert row.peaks.bf16 and row.peaks.fp16 and row.peaks.fp32
    # dense = half the datasheet's with-sparsity figure
    assert H100_SXM.peaks.bf16 == pytest.approx(1979 / 2)
    assert B200.peaks.fp8 == pytest.approx(9000 / 2)
    assert H200_SXM.dram_gbps == 4800 and H100_SXM.dram_gbps == 3350


def test_missing_precision_takes_the_rate_a_kernel_would_use():
    assert A100_SXM.peak_tflops(Precision.FP8) == A100_SXM.peaks.bf16  # no fp8 on Ampere
    assert H200_SXM.peak_tflops("fp4") == H200_SXM.peaks.fp8  # no fp4 on Hopper
    assert L40S.peak_tflops(Precision.FP64) == L40S.peaks.fp32


def test_calibration_is_kept_beside_the_datasheet():
    measured = H200_SXM.with_calibration(4100.0, {"bfloat16": 780.0, "float8_e4m3fn": 1400.0})
    assert measured.calibrated and not H200_SXM.calibrated
    assert measured.bandwidth_gbps() == 4100.0
    assert measured.bandwidth_gbps(use_measured=False) == 4800.0
    assert measured.peak_tflops("bf16") == 780.0 and measured.peak_source("bf16") == "measured"
    assert measured.peak_tflops("bf16", use_measured=False) == H200_SXM.peaks.bf16
    assert measured.peak_tflops("tf32") == H200_SXM.peaks.tf32  # not measured: datasheet
    assert measured.peak_source("tf32") == "datasheet"


@pytest.mark.parametrize(("text", "precision"), [
    ("bf16", Precision.BF16), ("bfloat16", Precision.BF16), ("torch.float16", Precision.FP16),
    ("float8_e4m3fn", Precision.FP8), ("float4_e2m1fn_x2", Precision.FP4), (Precision.TF32, Precision.TF32),
])
def test_precision_names(text, precision):
    assert as_precision(text) is precision


def test_unknown_precision_is_an_error():
    with pytest.raises(ValueError, match="unknown precision"):
        as_precision("int4")

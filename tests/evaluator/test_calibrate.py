"""services.evaluator.calibrate: the measurements run end to end on a CPU device (small sizes), the
result round-trips through JSON and lands on the hardware row beside the datasheet numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from services.evaluator import calibrate as cal
from shared.hardware import H200_SXM, cpu_name

CPU = torch.device("cpu")


def test_unit_conversions():
    assert cal.bandwidth_gbps(2_000_000_000, 1.0) == pytest.approx(2000.0)  # 2 GB in 1 ms
    assert cal.matmul_tflops(1000, 2.0) == pytest.approx(1.0)  # 2e9 FLOPs in 2 ms


def test_time_ms_times_every_repeat_after_warmup():
    calls = []
    times = cal.time_ms(lambda: calls.append(1), CPU, repeats=5, warmup=2)
    assert len(times) == 5 and len(calls) == 7 and all(t >= 0 for t in times)


def test_measurements_run_on_cpu():
    assert cal.measure_copy_bandwidth(CPU, nbytes=1 << 20, repeats=3) > 0
    assert cal.measure_matmul_tflops(CPU, torch.float32, n=64, repeats=3) > 0


def test_calibrate_skips_fp8_off_cuda_and_round_trips():
    result = cal.calibrate(CPU, copy_bytes=1 << 20, matmul_n=32, repeats=2, dtypes=("float32", "float8_e4m3fn"))
    assert set(result.tflops) == {"float32"}
    assert result.skipped and result.skipped[0].startswith("float8_e4m3fn")
    again = cal.Calibration.from_json(json.loads(json.dumps(result.as_json())))
    assert again == result
    assert json.loads(result.tflops_json) == dict(result.tflops)


def test_apply_to_and_table():
    result = cal.Calibration("NVIDIA H200", 4200.0, {"bfloat16": 800.0}, "2026-12-02T00:00:00+00:00", "2.13")
    spec = result.apply_to(H200_SXM)
    assert spec.bandwidth_gbps() == 4200.0 and spec.bandwidth_gbps(use_measured=False) == 4800.0
    assert spec.peak_tflops("bf16") == 800.0
    table = cal.format_table(result, H200_SXM)
    assert "copy bandwidth GB/s" in table and "0.88" in table  # 4200 / 4800


def test_main_writes_json_on_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "calibration.json"
    assert cal.main(["--out", str(out), "--device", "cpu", "--copy-mib", "1", "--matmul-n", "32",
                     "--repeats", "2"]) == 0
    data = json.loads(out.read_text())
    assert data["bandwidth_gbps"] > 0 and "bfloat16" in data["tflops"]
    assert f"calibration of CPU {cpu_name()}" in capsys.readouterr().out  # the name attempts record


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without CUDA")
def test_main_without_cuda_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert cal.main(["--out", str(tmp_path / "c.json")]) == 2
    assert "no CUDA device" in capsys.readouterr().err

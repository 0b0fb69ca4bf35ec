"""`kernelswarm sol`: T_sol per workload of a problem, as a table or JSON, without running a kernel."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernelswarm.cli import main
from services.evaluator.sandbox.counting import SandboxRunner
from shared.hardware import lookup
from shared.sol import describe_problem

REPO = Path(__file__).resolve().parents[2]
GEMM = REPO / "problems" / "llama31_8b_gemm_o_proj"
CALIBRATION = REPO / "docs" / "results" / "2026-12-03-calibration-h200.json"


def test_the_table_lists_every_workload_and_how_many_were_counted(capsys: pytest.CaptureFixture[str]):
    assert main(["sol", str(GEMM)]) == 0
    out = capsys.readouterr().out.splitlines()
    workloads = len((GEMM / "workload.jsonl").read_text().splitlines())
    assert out[0] == f"{GEMM} on H200 SXM, mode physical"
    assert len(out) == 2 + workloads + 1 and out[-1] == f"{workloads} of {workloads} workloads counted"
    assert all(line.split()[-1].replace(".", "").isdigit() for line in out[2:-1])  # a T_sol in ms on each


def test_json_gives_the_sol_models_figures_for_the_hardware_named(capsys: pytest.CaptureFixture[str]):
    assert main(["sol", str(GEMM), "--hardware", "NVIDIA H100 80GB HBM3", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    expected = describe_problem(GEMM, lookup("NVIDIA H100 80GB HBM3"), "ours", runner=SandboxRunner())
    assert [r["t_sol_ms"] for r in rows] == [r["t_sol_ms"] for r in expected]
    assert {r["hardware"] for r in rows} == {"H100 SXM"} and all(r["t_sol_ms"] > 0 for r in rows)


def test_solar_mode_and_a_calibration_change_the_pricing(capsys: pytest.CaptureFixture[str]):
    main(["sol", str(GEMM), "--json"])
    physical = json.loads(capsys.readouterr().out)
    main(["sol", str(GEMM), "--json", "--mode", "solar"])
    solar = json.loads(capsys.readouterr().out)
    assert {r["mode"] for r in solar} == {"solar"} and {r["hardware"] for r in solar} == {"B200 @ 1500 MHz (SOLAR)"}
    main(["sol", str(GEMM), "--json", "--calibration", str(CALIBRATION)])
    calibrated = json.loads(capsys.readouterr().out)
    assert {r["ceilings"] for r in calibrated} == {"fastest"} and {r["ceilings"] for r in physical} == {"datasheet"}
    assert all(c["t_sol_ms"] <= p["t_sol_ms"] for c, p in zip(calibrated, physical))  # never slower than the datasheet


@pytest.mark.parametrize("args, message", [
    (["/no/such/problem"], "no definition.json"),
    ([str(GEMM), "--hardware", "Voodoo 5"], "no hardware row for 'Voodoo 5'"),
    ([str(GEMM), "--calibration", str(GEMM / "definition.json")], "not a calibration JSON"),
])
def test_bad_input_is_a_clear_error(capsys: pytest.CaptureFixture[str], args: list[str], message: str):
    assert main(["sol", *args]) == 2
    assert message in " ".join(capsys.readouterr().err.split())

"""T_sol is a floor no measured kernel beats: every PASSED time committed under docs/results (the
library's seeds, torch eager and torch.compile, timed on an H200) is at or above the T_sol the
SOL model gives its workload today, on the H200 row calibrated with the ceilings measured on that
machine (docs/results/2026-12-03-calibration-h200.json). Priced at the measured ceilings alone,
torch's own GEMM fell below it (issue 29)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from shared.hardware import lookup
from shared.schema import load_problem
from shared.sol import estimate
from shared.sol_count import SolCountError, count_work

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "results"
CALIBRATION = json.loads((RESULTS / "2026-12-03-calibration-h200.json").read_text())


def library_runs() -> list[Path]:
    """The committed runs with per-workload times of library problems (bench/library.py's JSON)."""
    runs = []
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        rows = data.get("rows") if isinstance(data, dict) else None
        if rows and isinstance(rows[0], dict) and "seeds" in rows[0] and "H200" in str(data.get("hardware")):
            runs.append(path)
    return runs


@cache
def t_sol_ms(problem: str, uuid: str, ceilings: str = "fastest") -> float | None:
    loaded = load_problem(REPO / "problems" / problem, with_seeds=False)
    [workload] = [w for w in loaded.workloads if w.uuid == uuid] or [None]
    if workload is None:
        return None  # a workload the library has since dropped
    try:
        work = count_work(loaded.definition, workload, loaded.root)
    except SolCountError:
        return None
    hardware = lookup("NVIDIA H200").with_calibration(CALIBRATION["bandwidth_gbps"], CALIBRATION["tflops"])
    return estimate(work, hardware, ceilings=ceilings).t_sol_ms


def measurements(path: Path):
    for row in json.loads(path.read_text())["rows"]:
        if not (REPO / "problems" / row["problem"]).is_dir():
            continue
        for seed in row["seeds"].values():
            for workload in seed.get("workloads") or []:
                if workload.get("status") != "PASSED":
                    continue
                for what in ("latency_ms", "eager_ms", "compile_ms"):
                    if workload.get(what):
                        yield row["problem"], workload["uuid"], f"{seed.get('language')} {what}", workload[what]


@pytest.mark.parametrize("path", library_runs(), ids=lambda p: p.name)
def test_no_committed_time_is_below_its_t_sol(path: Path):
    checked, below = 0, []
    for problem, uuid, what, measured_ms in measurements(path):
        floor = t_sol_ms(problem, uuid)
        if floor is None:
            continue
        checked += 1
        if measured_ms < floor:
            below.append(f"{problem} {uuid[:8]} {what} {measured_ms:.6g} ms < T_sol {floor:.6g} ms")
    assert checked > 0, "no measurement of a library workload in this file"
    assert not below, "\n".join(below)


def test_priced_at_the_measured_ceilings_alone_some_did_fall_below():
    """The case the test above guards against is real: at the calibration's ceilings alone (772
    TFLOP/s bf16, 4254 GB/s), torch's own times beat T_sol on some workloads."""
    below = [m for path in library_runs() for m in measurements(path)
             if (floor := t_sol_ms(m[0], m[1], "measured")) is not None and m[3] < floor]
    assert below

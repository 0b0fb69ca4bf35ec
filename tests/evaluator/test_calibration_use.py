"""A GPU evaluator calibrates at start when nothing recent is stored, keeps the result in the
database, and every attempt then prices T_sol at the measured ceilings, the datasheet's kept beside."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import MappingProxyType

import pytest

from services.evaluator import calibrate as cal
from services.evaluator import record
from services.evaluator.evaluate import AttemptResult, environment
from services.evaluator.record import evaluate_attempt
from services.evaluator.score import score_workload
from shared.db import CalibrationRow
from shared.hardware import H200_SXM
from shared.repository import create_attempt, put_solution, upsert_problem
from shared.schema import Status, load_problem

PROBLEMS = Path(__file__).resolve().parents[2] / "problems"
PROBLEM = load_problem(PROBLEMS / "llama31_8b_rmsnorm")
H200 = "NVIDIA H200"


def measured(when: datetime | None = None, bandwidth: float = 4254.0) -> cal.Calibration:
    when = when or datetime.now(timezone.utc)
    return cal.Calibration(H200, bandwidth, MappingProxyType({"bfloat16": 772.0}),
                           when.isoformat(timespec="seconds"), "test")


class Measure:
    def __init__(self, result: cal.Calibration | Exception) -> None:
        self.result, self.calls = result, 0

    def __call__(self, device: str) -> cal.Calibration:
        self.calls += 1
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def test_measured_once_then_read_from_the_database(runtime):
    measure = Measure(measured())
    first = cal.ensure(runtime.db, "cuda", H200, measure)
    second = cal.ensure(runtime.db, "cuda", H200, Measure(RuntimeError("must not measure again")))
    assert measure.calls == 1
    assert first.bandwidth_gbps == second.bandwidth_gbps == 4254.0
    assert dict(second.tflops) == {"bfloat16": 772.0}


def test_an_old_calibration_is_measured_again(runtime):
    cal.store(runtime.db, measured(datetime.now(timezone.utc) - cal.MAX_AGE - timedelta(hours=1), 4000.0))
    measure = Measure(measured(bandwidth=4300.0))
    assert cal.ensure(runtime.db, "cuda", H200, measure).bandwidth_gbps == 4300.0
    assert measure.calls == 1
    assert cal.stored(runtime.db, H200).bandwidth_gbps == 4300.0  # the newest prices attempts


def test_unknown_hardware_or_a_failed_measurement_leaves_the_datasheet(runtime):
    assert cal.ensure(runtime.db, "cuda", "Some GPU we have no row for", Measure(measured())) is None
    assert cal.ensure(runtime.db, "cuda", H200, Measure(RuntimeError("out of memory"))) is None
    with runtime.db.session() as session:
        assert session.query(CalibrationRow).count() == 0


def test_the_score_keeps_each_sources_t_sol_beside_the_faster_one_it_is_priced_at():
    """Memory-bound on an H200 calibrated at 4254 GB/s against the datasheet's 4800: T_sol takes the
    faster, the datasheet's; the trace keeps the measured figure (slower by the bandwidth ratio)."""
    workload = PROBLEM.workloads[-1]
    calibrated = measured().apply_to(H200_SXM)
    plain = score_workload(PROBLEM.definition, workload, PROBLEM.root, H200_SXM, 0.01, 0.1, None).sol
    priced = score_workload(PROBLEM.definition, workload, PROBLEM.root, calibrated, 0.01, 0.1, None).sol
    assert plain.t_sol_datasheet_ms is None and plain.t_sol_measured_ms is None
    assert priced.t_sol_datasheet_ms == pytest.approx(plain.t_sol_ms)
    assert priced.t_sol_measured_ms == pytest.approx(plain.t_sol_ms * 4800.0 / 4254.0)  # the bandwidth ratio
    assert priced.t_sol_ms == pytest.approx(plain.t_sol_ms)  # the faster of the two


def test_an_attempt_is_priced_with_the_stored_calibration(runtime, monkeypatch):
    here = environment("cpu").hardware  # this machine stands in for an H200 with a stored calibration
    cal.store(runtime.db, cal.Calibration(here, 4254.0, MappingProxyType({"bfloat16": 772.0}),
                                          datetime.now(timezone.utc).isoformat(timespec="seconds"), "test"))
    monkeypatch.setattr(record, "hardware_for", lambda name: H200_SXM if name == here else None)
    monkeypatch.setattr(record, "spares_for", lambda *args: None)
    seen = []

    def stand_in(problem, solution, config, max_workloads=None, attempt=None, progress=None):
        seen.append(config.hardware)
        return AttemptResult(Status.COMPILE_ERROR, [], None, None, 0, "stand-in")

    monkeypatch.setattr(record, "evaluate", stand_in)
    with runtime.db.session() as session:
        problem_id = upsert_problem(session, PROBLEM).id
        digest = put_solution(session, runtime.store, problem_id, PROBLEM.seed("pytorch"))
        attempt_id = create_attempt(session, problem_id, digest, "cpu").id
    evaluate_attempt(runtime, attempt_id, "cpu", "evaluator@a")
    assert seen[0] is not None and seen[0].calibrated
    assert seen[0].bandwidth_gbps() == 4254.0 and seen[0].bandwidth_gbps(use_measured=False) == H200_SXM.dram_gbps


def test_a_cpu_evaluator_calibrates_too_and_its_attempts_get_a_sol_score_without_a_floor(runtime, monkeypatch):
    """A CPU has no datasheet row: what its evaluator measured at start prices T_sol alone, so a CPU
    run has SOL scores; no physical floor is drawn from it (a CPU's caches beat its measured copy)."""
    here = environment("cpu").hardware
    measure = Measure(cal.Calibration(here, 13.8, MappingProxyType({"float32": 0.05, "bfloat16": 0.13}),
                                      datetime.now(timezone.utc).isoformat(timespec="seconds"), "test"))
    assert cal.ensure(runtime.db, "cpu", here, measure).hardware == here and measure.calls == 1
    spec = cal.stored(runtime.db, here).as_spec()
    assert (spec.name, spec.datasheet, spec.bandwidth_gbps(), spec.peak_tflops("fp32")) == (here, False, 13.8, 0.05)

    workload = PROBLEM.workloads[-1]
    priced = score_workload(PROBLEM.definition, workload, PROBLEM.root, spec, 1.0, 2.0, None)
    assert priced.hack is None and priced.sol is not None and priced.sol.hardware == here
    assert 0.5 < priced.sol.score <= 1.0  # twice as fast as the reference, which is T_b here
    impossible = score_workload(PROBLEM.definition, workload, PROBLEM.root, spec, priced.sol.t_sol_ms / 100, 2.0, None)
    assert impossible.hack is None  # beyond the measured ceilings, yet no accusation on a CPU

    monkeypatch.setattr(record, "spares_for", lambda *args: None)
    assert record._config(runtime, "cpu", here).hardware == spec

    for name in ("sdxl_unet_groupnorm_silu", "llama31_8b_gemm_o_proj"):  # fp16 and bf16 work: priced too
        other = load_problem(PROBLEMS / name)
        scored = score_workload(other.definition, other.workloads[0], other.root, spec, 1.0, 2.0, None)
        assert scored.sol is not None and scored.hack is None, name
    for precision in ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "fp4"):
        assert spec.fastest_tflops(precision) > 0, precision  # a CPU measured in fp32 and bf16 only


def test_a_row_without_a_rate_for_the_works_precision_leaves_the_workload_unscored_not_crashed():
    """Seen on a CPU row before every precision had a rate: the evaluation raised, its attempt was
    retried and stayed in flight. A missing rate costs the score, never the verdict."""
    from shared.hardware import HardwareSpec, Peaks

    bare = HardwareSpec("bare", "a part with fp32 only", 100.0, Peaks(fp64=None, fp32=1.0, tf32=None, bf16=None,
                                                                     fp16=None), "test")
    half = load_problem(PROBLEMS / "sdxl_unet_groupnorm_silu")
    verdict = score_workload(half.definition, half.workloads[0], half.root, bare, 1.0, 2.0, None)
    assert verdict.sol is None and verdict.hack is None


def test_the_cpu_calibration_is_stored_under_the_name_attempts_record():
    result = cal.calibrate("cpu", copy_bytes=1 << 20, matmul_n=32, repeats=2)
    assert result.hardware == environment("cpu").hardware and set(result.tflops) == {"float32", "bfloat16"}
    assert result.as_spec().peak_tflops("fp32") == result.tflops["float32"]

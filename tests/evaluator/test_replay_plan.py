"""Launch plans as the evaluator receives them from the untrusted record step (timer/plan.py):
parsed strictly, checked against CUDA's limits, the cubin's kernels and the call's buffers, and
two recordings compared in words."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from services.evaluator.timer.plan import (
    MAX_STEPS, Plan, PlanInvalid, cubin_kernels, differences, parse, validate,
)

KERNELS = frozenset({"scale"})
SIZES = {("input", "x"): 4096, ("output", "y"): 4096}


def plan(*steps: dict, scratch: list | None = None, returned: list | None = None) -> Plan:
    return parse({"steps": list(steps), "scratch": scratch or [], "returned": returned})


def launch(**changes) -> dict:
    return {"op": "launch", "kernel": "scale", "grid": [4, 1, 1], "block": [256, 1, 1], "shared_mem_bytes": 0,
            "args": [{"kind": "input", "name": "x"}, {"kind": "output", "name": "y", "offset_bytes": 16},
                     {"kind": "scalar", "dtype": "int32", "value": 1024}], **changes}


def test_a_plan_inside_every_limit_is_valid():
    validate(plan(launch(), {"op": "fill", "buffer": {"kind": "scratch", "index": 0}, "size_bytes": 64,
                             "dtype": "float32", "value": 0}, scratch=[{"index": 0, "size_bytes": 64}]),
             KERNELS, SIZES)


@pytest.mark.parametrize("step, scratch, said", [
    (launch(kernel="other"), [], "not a kernel of the cubin"),
    (launch(grid=[2**31, 1, 1]), [], "outside CUDA's limits"),
    (launch(grid=[0, 1, 1]), [], "outside CUDA's limits"),
    (launch(block=[1024, 2, 1]), [], "more than 1024 threads"),
    (launch(shared_mem_bytes=1 << 20), [], "dynamic shared memory"),
    (launch(args=[{"kind": "input", "name": "x", "offset_bytes": 4097}]), [], "outside input 'x'"),
    (launch(args=[{"kind": "output", "name": "z"}]), [], "no output buffer 'z'"),
    (launch(args=[{"kind": "scratch", "index": 1}]), [{"index": 0, "size_bytes": 8}], "no scratch buffer 1"),
    (launch(args=[{"kind": "scalar", "dtype": "int32", "value": 2**31}]), [], "does not fit a int32"),
    (launch(args=[{"kind": "scalar", "dtype": "float32", "value": 1.0, "input": "eps"}]), [], "no scalar input"),
    ({"op": "fill", "buffer": {"kind": "input", "name": "x"}, "size_bytes": 4, "dtype": "float32", "value": 0},
     [], "inputs are read-only"),
    ({"op": "fill", "buffer": {"kind": "scratch", "index": 0, "offset_bytes": 8}, "size_bytes": 64,
      "dtype": "float32", "value": 0}, [{"index": 0, "size_bytes": 64}], "outside scratch 0"),
    (launch(), [{"index": 1, "size_bytes": 8}], "numbered 0, 1"),
    ({"op": "fill", "buffer": {"kind": "output", "name": "y", "offset_bytes": 2}, "size_bytes": 8,
      "dtype": "float32", "value": 0}, [], "not whole elements"),
    (launch(args=[{"kind": "output", "name": "y", "index": 0}]), [], "named by name alone"),
])
def test_a_plan_out_of_bounds_is_refused_with_the_reason(step, scratch, said):
    with pytest.raises(PlanInvalid, match=said):
        validate(plan(step, scratch=scratch), KERNELS, SIZES)


def test_what_is_not_a_plan_does_not_parse():
    for junk in ("plans", {"steps": [{"op": "exec", "code": "x"}]}, {"steps": [launch(grid=[1, 1])]},
                 {"steps": [launch(args=[{"kind": "input", "name": "x", "offset_bytes": -8}])]},
                 {"steps": [launch()] * (MAX_STEPS + 1)}, {"steps": [], "extra": 1}):
        with pytest.raises(PlanInvalid, match="not a launch plan"):
            parse(junk)


def test_a_returned_tensor_must_lie_inside_its_buffer():
    inside = {"buffer": {"kind": "scratch", "index": 0, "offset_bytes": 16}, "dtype": "float32",
              "shape": [4, 4], "stride": [4, 1]}
    validate(plan(returned=[inside], scratch=[{"index": 0, "size_bytes": 80}]), KERNELS, SIZES)
    with pytest.raises(PlanInvalid, match="outside scratch 0"):
        validate(plan(returned=[inside], scratch=[{"index": 0, "size_bytes": 79}]), KERNELS, SIZES)


def test_differences_say_what_differs():
    assert differences(plan(launch()), plan(launch())) == []
    said = differences(plan(launch()), plan(launch(grid=[8, 1, 1]), launch()))
    assert said[0] == "1 launches and fills in one call, 2 in the other"
    assert "grid (4, 1, 1) block (256, 1, 1) in one call" in said[1]
    assert said[1].endswith("grid (8, 1, 1) block (256, 1, 1) in the other")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_the_cubins_kernels_are_its_entries_not_its_device_functions(tmp_path):
    (tmp_path / "k.cu").write_text(
        '__device__ __noinline__ float twice(float a) { return 2 * a; }\n'
        'extern "C" __global__ void scale(float* y) { y[0] = twice(y[0]); }\n'
        'template <int N> __global__ void fill(float* y) { y[0] = N; }\n'
        'template __global__ void fill<3>(float*);\n')
    subprocess.run(["nvcc", "-cubin", "-arch=sm_90a", "-o", tmp_path / "k.cubin", tmp_path / "k.cu"], check=True)
    assert cubin_kernels((tmp_path / "k.cubin").read_bytes()) == {"scale", "_Z4fillILi3EEvPf"}
    with pytest.raises(ValueError):
        cubin_kernels(b"\x7fELF" + b"\x02\x01" + b"\0" * 20)


def test_the_routing_of_forged_and_failed_records():
    from shared.schema import Definition, Status, Workload
    from services.evaluator.timer.route import route

    definition = Definition.model_validate({
        "name": "copy", "axes": {"n": {"type": "var"}}, "inputs": {"x": {"shape": ["n"], "dtype": "float32"}},
        "outputs": {"y": {"shape": ["n"], "dtype": "float32"}}, "reference": "def run(x):\n    return x\n"})
    workloads = {i: Workload.model_validate({"uuid": f"w{i}", "axes": {"n": 1024}, "inputs": {"x": {"type": "random"}}})
                 for i in range(5)}
    good = plan(launch(args=[{"kind": "input", "name": "x"}, {"kind": "output", "name": "y"}])).model_dump(mode="json")
    wide = plan(launch(grid=[1, 1 << 20, 1])).model_dump(mode="json")
    routed = route(definition, workloads, {
        0: {"status": "OK", "plans": [good, good]},
        1: {"status": "PASSED", "message": "trust me"},
        2: {"status": "RUNTIME_ERROR", "message": "AssertionError"},
        3: {"status": "OK", "plans": [good]},
        4: {"status": "OK", "plans": [wide, wide]}}, KERNELS)
    assert routed.mode == "replay" and list(routed.plans) == ["w0"]
    assert routed.failed[1][0] is Status.REWARD_HACK and routed.failed[3][0] is Status.REWARD_HACK
    assert routed.failed[2] == (Status.RUNTIME_ERROR, "AssertionError")
    assert routed.failed[4][0] is Status.RUNTIME_ERROR and "outside CUDA's limits" in routed.failed[4][1]
    returning = route(definition, {0: workloads[0]}, {0: {"status": "OK", "plans": [good, good]}}, KERNELS,
                      destination_passing=False)
    assert returning.failed[0][0] is Status.RUNTIME_ERROR and "returned 0 tensors where 1" in returning.failed[0][1]
    other = plan(launch(grid=[8, 1, 1], args=[{"kind": "input", "name": "x"}])).model_dump(mode="json")
    differs = route(definition, {0: workloads[0]}, {0: {"status": "OK", "plans": [good, other]}}, KERNELS)
    assert differs.mode == "in_process" and differs.plans is None
    assert differs.reason.startswith("not replayed, timed in the solution's own process: workload w0: its launches "
                                     "depend on the input values (two input sets, two plans: step 0:")

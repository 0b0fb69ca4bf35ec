"""Hacks that need a GPU (issue 10's list): a time below the physical floor, L2 lines marked persisting across calls, a CUDA
graph replayed on the pointers it captured, work left running after the call returns, and results
copied from an earlier call's outputs by a stream the timer might not watch. None may end PASSED with a time it did not pay for.
Hole 7 (docs/results/hardening.md): results forged around the outer clock's handshake with a
plausible time, every output computed honestly. Closed for `cuda` by record and replay (the forger
never runs in the process that times it); open, a strict xfail, where a solution is timed in its
own process (languages whose host code is the kernel, and a `cuda` solution whose record refused).

Run on the GPU machine: `pytest -m gpu tests/gpu/test_gpu_hacks.py`.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from services.evaluator.evaluate import evaluate  # noqa: E402
from shared.schema import Solution, Status  # noqa: E402
from test_cuda_language import GOOD, config, cuda_solution, problem  # noqa: E402,F401 - shared fixtures

# Captures `y = x * w` once per shape with the first call's tensors, then only replays: every later
# call gets the first call's product, in the first call's output buffer.
GRAPH_REPLAY = """
import torch

_graphs = {}


def run(x, w, y):
    key = x.shape
    if key not in _graphs:
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            torch.mul(x, w, out=y)
            torch.cuda.synchronize()
            with torch.cuda.graph(graph, stream=stream):
                torch.mul(x, w, out=y)
        torch.cuda.current_stream().wait_stream(stream)
        _graphs[key] = graph
    _graphs[key].replay()
"""

# Right results, but the work of each call is queued behind a spin of 5e6 SM cycles (2.5 ms at
# 1980 MHz) on a stream of its own and
# the call returns at once: a timer that stops when the call returns would see almost nothing.
IN_FLIGHT = """
import torch

_side = None


def run(x, w, y):
    global _side
    if _side is None:
        _side = torch.cuda.Stream()
    _side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(_side):
        torch.cuda._sleep(5_000_000)
        torch.mul(x, w, out=y)
"""


# The documented use of persisting L2: the set-aside raised once at import, an access policy window
# over the call's input on the current stream (left there after the call). Lines it marks would
# outlive a flush; the timer resets them before every run's flush (bench/persisting_l2.py measures
# it). It is an optimisation, not a hack: it must pass, with the reset said in the trace.
PERSISTING_L2 = """
import torch
from cuda.bindings import runtime

_props = runtime.cudaGetDeviceProperties(0)[1]
runtime.cudaDeviceSetLimit(runtime.cudaLimit.cudaLimitPersistingL2CacheSize, _props.persistingL2CacheMaxSize)
_ids = getattr(runtime, "cudaStreamAttrID", None) or runtime.cudaLaunchAttributeID
_attr = getattr(_ids, "cudaStreamAttributeAccessPolicyWindow", None) or _ids.cudaLaunchAttributeAccessPolicyWindow
_value_type = getattr(runtime, "cudaStreamAttrValue", None) or runtime.cudaLaunchAttributeValue


def run(x, w, y):
    value = _value_type()
    policy = value.accessPolicyWindow
    policy.base_ptr = x.data_ptr()
    policy.num_bytes = min(x.numel() * x.element_size(), _props.accessPolicyMaxWindowSize)
    policy.hitRatio = 1.0
    policy.hitProp = runtime.cudaAccessProperty.cudaAccessPropertyPersisting
    policy.missProp = runtime.cudaAccessProperty.cudaAccessPropertyStreaming
    value.accessPolicyWindow = policy
    (error,) = runtime.cudaStreamSetAttribute(torch.cuda.current_stream().cuda_stream, _attr, value)
    assert int(error) == 0, error
    torch.mul(x, w, out=y)
"""


def pytorch_solution(name: str, source: str) -> Solution:
    return Solution.model_validate({
        "name": name, "definition": "scale", "author": "test",
        "spec": {"languages": ["pytorch"], "target_hardware": ["H200"], "entry_point": "main.py::run"},
        "sources": [{"path": "main.py", "content": source}]})


def test_a_graph_replayed_on_captured_pointers_is_caught(problem, config):
    result = evaluate(problem, pytorch_solution("graph_replay", GRAPH_REPLAY), config)
    assert result.status is not Status.PASSED, result.message
    assert result.status in (Status.INCORRECT_NUMERICAL, Status.REWARD_HACK), result.status


def test_work_left_in_flight_is_timed_or_caught(problem, config):
    """Either the spin behind each call is counted (CUPTI sees every stream until the device is
    idle) or the attempt is refused; a PASSED with a time under the spin's would be a hole.
    `torch.cuda._sleep` counts SM cycles: 5e6 of them at the clock the trace recorded."""
    result = evaluate(problem, pytorch_solution("in_flight", IN_FLIGHT), config)
    if result.status is Status.PASSED:
        for trace in result.traces:
            timing = trace.evaluation.timing
            spin_ms = 5e6 / (max(timing.sm_clock_mhz_before, timing.sm_clock_mhz_after) * 1e3)
            assert timing.median_ms > 0.9 * spin_ms, (spin_ms, timing)
    else:
        assert result.status in (Status.REWARD_HACK, Status.INCORRECT_NUMERICAL), result.message


def test_persisting_l2_lines_pass_and_are_reset_before_every_flush(problem, config):
    """Marking lines persisting is allowed; the timer takes the mark away before each run's flush."""
    pytest.importorskip("cuda.bindings")
    result = evaluate(problem, pytorch_solution("persisting_l2", PERSISTING_L2), config)
    assert result.status is Status.PASSED, result.message
    assert all(t.evaluation.timing.l2_persisting_reset is True for t in result.traces), result.traces


def test_a_time_below_the_physical_floor_is_a_reward_hack_on_the_gpu(problem, config):
    """The SOL guard with the GPU's own timing: priced on an H200 row whose bandwidth is a millionth
    of a GB/s, a real kernel's real time is impossibly fast, and must be REWARD_HACK, never a record."""
    import dataclasses

    from shared.hardware import lookup

    slow = dataclasses.replace(lookup("NVIDIA H200"), dram_gbps=1e-6, measured_bandwidth_gbps=None)
    result = evaluate(problem, cuda_solution(GOOD), dataclasses.replace(config, hardware=slow))
    assert result.status is Status.REWARD_HACK and "below the physical floor" in result.message, result.message
    assert all(t.evaluation.performance is None for t in result.traces)


# Forged at import, then exit before the harness runs (hole 7 of hardening.md): the solution plays
# the harness's part. It computes every output honestly on the GPU, from the seeds its job and the
# outer clock's `go` give it, saves them where the harness would, and reports MEDIANS, a time it
# made up, on the private channel and in the result file. Only its reported time is false.
FORGED_AROUND_THE_HANDSHAKE = """
import json
import os
import socket
from pathlib import Path

import torch

from services.evaluator.harness import tensorfile
from services.evaluator.harness.inputs import make_inputs
from shared.schema import Definition, Workload

MEDIANS = {}
JOB = json.loads(Path("job.json").read_text())
DEFINITION = Definition.model_validate(JOB["definition"])
DEVICE = torch.device("cuda")


def _save(index, workload, seed, s):
    inputs = make_inputs(DEFINITION, Workload.model_validate(workload), seed, DEVICE, None, None)
    tensorfile.save({"y": inputs["x"] * inputs["w"]}, Path(JOB["outputs_dir"]) / f"w{index}_s{s}.st")


def _send(channel, **message):
    channel.sendall(json.dumps(message).encode() + b"\\n")


channel = socket.socket(fileno=JOB["clock_fd"])
reader = channel.makefile("rb")
rounds, results = JOB["correctness_rounds"], []
for index, workload, timed_sets, seeds in zip(JOB["indices"], JOB["workloads"], JOB["timed_sets"], JOB["set_seeds"]):
    for s in range(rounds):
        _save(index, workload, seeds[s], s)
    _send(channel, op="ready", uuid=workload["uuid"])
    go = json.loads(reader.readline())
    for t, seed in enumerate(go["set_seeds"]):
        _save(index, workload, seed, rounds + t)
    torch.cuda.synchronize()
    median = MEDIANS[workload["uuid"]]
    _send(channel, op="end", uuid=workload["uuid"], runs=timed_sets, total_ms=timed_sets * median, median_ms=median)
    reader.readline()  # the evaluator's answer: `sealed` (its window fits its allowance)
    results.append({"uuid": workload["uuid"], "status": "OK",
                    "latency": {"median_ms": median, "min_ms": median, "max_ms": median, "runs": timed_sets,
                                "clock": "cupti"}})
Path(JOB["result_path"]).write_text(json.dumps({"workloads": results}))
os._exit(0)
"""


def _made_up_medians(problem, config) -> tuple[dict, dict]:
    """The honest kernel's times, and times to forge: 80% of each, never less than 1.1 times the
    physical floor the evaluator applies (`shared.sol.hack_floor_ms` on the H200's row): a
    plausible record. Where its set-up goes wrong the test fails outright (`pytest.fail`)."""
    from shared.hardware import lookup
    from shared.sol import hack_floor_ms
    from shared.sol_count import count_work

    h200 = lookup("NVIDIA H200")
    honest = evaluate(problem, cuda_solution(GOOD), config)
    if honest.status is not Status.PASSED:
        pytest.fail(f"the honest kernel did not pass: {honest.message}")
    times = {t.workload.uuid: t.evaluation.performance.latency_ms for t in honest.traces}
    floors = {w.uuid: hack_floor_ms(count_work(problem.definition, w, problem.root), h200) for w in problem.workloads}
    medians = {uuid: max(0.8 * ms, 1.1 * floors[uuid]) for uuid, ms in times.items()}
    if any(medians[uuid] >= ms for uuid, ms in times.items()):
        pytest.fail(f"no made-up time lies between the physical floor and the honest time: {times}")
    return times, medians


def test_a_plausible_time_forged_around_the_handshake_is_not_seen_for_cuda(problem, config):
    """Hole 7 for `cuda` (hardening.md), closed by record and replay: the forger's launch.py forges
    wherever its process is the one timed (it has the outer clock's channel) and is honest
    elsewhere. It runs only in the record child, which times nothing and has no channel: its honest
    plan is replayed by the timer child, which never imports it, and it passes with the time its
    kernel took, never the made-up one."""
    _times, medians = _made_up_medians(problem, config)
    source = forger_for_cuda(FORGED_AROUND_THE_HANDSHAKE.replace("MEDIANS = {}", f"MEDIANS = {medians!r}"))
    result = evaluate(problem, cuda_solution(GOOD, "forged_around_the_handshake", source), config)
    assert result.status is Status.PASSED, result.message
    reported = {t.workload.uuid: t.evaluation.performance.latency_ms for t in result.traces}
    assert all(t.evaluation.timing.mode == "replay" for t in result.traces), result.traces
    assert all(reported[u] != pytest.approx(m, rel=1e-6) for u, m in medians.items()), (reported, medians)


@pytest.mark.xfail(reason="hole 7 (hardening.md) where a solution is timed in its own process: the outer clock's "
                          "allowance on a GPU holds the whole work of a short kernel's timed batch, and a made-up "
                          "time above the SOL bound is not seen; a `cuda` forger gets there by refusing its record "
                          "(tensor work on the host while recorded)", raises=AssertionError, strict=True)
@pytest.mark.parametrize("language", ["pytorch", "cuda_refusing_its_record"])
def test_a_plausible_time_forged_around_the_handshake_is_not_seen_in_process(problem, config, language):
    """The test fails (XPASS, strict) once the hole closes; where its set-up goes wrong it fails
    outright (`pytest.fail`, not the AssertionError the xfail takes)."""
    times, medians = _made_up_medians(problem, config)
    source = FORGED_AROUND_THE_HANDSHAKE.replace("MEDIANS = {}", f"MEDIANS = {medians!r}")
    forger = pytorch_solution("forged_around_the_handshake", source) if language == "pytorch" else \
        cuda_solution(GOOD, "forged_in_process", forger_for_cuda(source, refuse_the_record=True))
    result = evaluate(problem, forger, config)
    if result.status is Status.PASSED:
        reported = {t.workload.uuid: t.evaluation.performance.latency_ms for t in result.traces}
        if reported != pytest.approx(medians):
            pytest.fail(f"PASSED, but not with the made-up times: {reported} against {medians}")
    elif result.status is not Status.REWARD_HACK:
        pytest.fail(f"the forgery itself failed: {result.status.value}: {result.message}")
    assert result.status is not Status.PASSED, f"PASSED with made-up medians {medians}, honest {times}"


def forger_for_cuda(source: str, refuse_the_record: bool = False) -> str:
    """FORGED_AROUND_THE_HANDSHAKE as a `cuda` launch.py: the forgery runs at import only where the
    job gives the outer clock's channel (the process the harness times); elsewhere an honest `run`
    launches the kernel. `refuse_the_record`: that `run` also does tensor work while recorded, so
    that the attempt is timed in process, where the forgery runs."""
    head, loop = source.split("\nchannel = socket.socket", 1)
    body = "\n".join("    " + line if line else line for line in ("channel = socket.socket" + loop).splitlines())
    work = "    if JOB.get('mode') == 'record':\n        y.add_(0)\n" if refuse_the_record else ""
    return (head + "\n\ndef _forge():\n" + body
            + "\n\n\nif isinstance(JOB.get('clock_fd'), int):\n    _forge()\n\n\n"
            + "def run(x, w, y, *, kernels):\n" + work + "    n = y.numel()\n"
            + "    kernels.scale(x, w, y, n, grid=((n + 255) // 256,), block=(256,))\n")

"""Hacks that need a GPU (issue 10's list): L2 kept for persisting accesses across calls, a CUDA
graph replayed on the pointers it captured, work left running after the call returns, and results
copied from an earlier call's outputs by a stream the timer might not watch. None may end PASSED with a time it did not pay for.

Run on the GPU machine: `pytest -m gpu tests/gpu/test_gpu_hacks.py`.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from services.evaluator.evaluate import evaluate  # noqa: E402
from shared.schema import Solution, Status  # noqa: E402
from test_cuda_language import config, problem  # noqa: E402,F401 - shared fixtures

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


# Sets aside L2 for persisting accesses at import and keeps it: lines marked persisting (here by an
# access policy window a solution could put over the memory the harness writes before each run)
# would outlive the flush between timed runs. The guard reads the set-aside after every call.
PERSISTING_L2 = """
import torch
from cuda.bindings import runtime

runtime.cudaDeviceSetLimit(runtime.cudaLimit.cudaLimitPersistingL2CacheSize, 8 << 20)


def run(x, w, y):
    torch.mul(x, w, out=y)
"""

# The same set-aside, taken and given back within each call: allowed (nothing outlives the call).
PERSISTING_L2_WITHIN_A_CALL = """
import torch
from cuda.bindings import runtime


def run(x, w, y):
    runtime.cudaDeviceSetLimit(runtime.cudaLimit.cudaLimitPersistingL2CacheSize, 8 << 20)
    torch.mul(x, w, out=y)
    runtime.cudaDeviceSetLimit(runtime.cudaLimit.cudaLimitPersistingL2CacheSize, 0)
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


def test_l2_kept_for_persisting_accesses_across_calls_is_caught(problem, config):
    """A cache-residency game: L2 set aside for persisting lines and left so after the call.
    Taken and given back within a call, the same set-aside passes."""
    pytest.importorskip("cuda.bindings")
    kept = evaluate(problem, pytorch_solution("persisting_l2", PERSISTING_L2), config)
    assert kept.status is Status.REWARD_HACK and "persisting" in kept.message, kept.message
    within = evaluate(problem, pytorch_solution("persisting_l2_within", PERSISTING_L2_WITHIN_A_CALL), config)
    assert within.status is Status.PASSED, within.message

"""The recording `kernels` handle on CPU tensors (harness/recorder.py): what a `cuda` solution's
launch.py asks for in one call becomes a launch plan, tensors named as the call's buffers by
address; host tensor work and pointers to nothing of the call refuse the plan."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services.evaluator.timer.plan import BufferArg, Fill, Launch, ScalarArg, differences
from services.evaluator.harness.recorder import RecordingKernels, record_call

KERNELS = RecordingKernels(frozenset({"rows", "reduce"}))


def call_set(seed: int = 0, n: int = 8) -> tuple[dict, dict]:
    g = torch.Generator().manual_seed(seed)
    inputs = {"x": torch.randn(n, 16, generator=g), "w": torch.randn(16, generator=g), "eps": 1e-5}
    return inputs, {"y": torch.full((n, 16), float("nan")), "s": torch.full((16,), float("nan"))}


def two_kernels(x, w, eps, y, s, *, kernels):
    """The shape of the library's seeds: checks, scratch allocated and zeroed, two launches."""
    rows = x.shape[0]
    assert x.is_contiguous() and x.data_ptr() % 4 == 0
    partial = torch.empty((4, 16), dtype=torch.float32, device=x.device)
    partial.zero_()
    kernels.rows(x, w[4:], y[1:], partial, rows, eps, 0.5, np.int64(7), grid=(rows, 2), block=(128,))
    kernels.reduce(partial, s, 4, grid=16, block=(32, 4), shared_mem=1024)


def test_a_call_becomes_its_steps_with_buffers_named_and_offsets_in_bytes():
    inputs, outputs = call_set()
    plan = record_call(two_kernels, inputs, outputs, KERNELS)
    assert plan.refused is None
    fill, rows, reduce = plan.steps
    assert fill == Fill(buffer=BufferArg(kind="scratch", index=0), size_bytes=4 * 16 * 4, dtype="float32", value=0)
    assert isinstance(rows, Launch) and rows.kernel == "rows"
    assert (rows.grid, rows.block, rows.shared_mem_bytes) == ((8, 2, 1), (128, 1, 1), 0)
    assert rows.args[:4] == [BufferArg(kind="input", name="x"), BufferArg(kind="input", name="w", offset_bytes=16),
                             BufferArg(kind="output", name="y", offset_bytes=64),
                             BufferArg(kind="scratch", index=0)]
    assert rows.args[4:] == [ScalarArg(dtype="int32", value=8),
                             ScalarArg(dtype="float32", value=float(np.float32(1e-5)), input="eps"),
                             ScalarArg(dtype="float32", value=0.5), ScalarArg(dtype="int64", value=7)]
    assert (reduce.grid, reduce.block, reduce.shared_mem_bytes) == ((16, 1, 1), (32, 4, 1), 1024)
    assert reduce.args == [BufferArg(kind="scratch", index=0), BufferArg(kind="output", name="s"),
                           ScalarArg(dtype="int32", value=4)]
    assert [(s.index, s.size_bytes) for s in plan.scratch] == [(0, 256)]


def test_two_sets_of_other_values_give_the_same_plan():
    first = record_call(two_kernels, *call_set(0), KERNELS)
    second = record_call(two_kernels, *call_set(1), KERNELS)
    assert differences(first, second) == []


def branch_on_values(x, w, eps, y, s, *, kernels):
    """Host logic reading the values (on a CPU `numpy()` dispatches no operator: only the second
    recording can tell)."""
    blocks = 2 if x.numpy()[0, 0] > 0 else 3
    kernels.rows(x, w, y, s, 1, eps, grid=(blocks,), block=(32,))


def test_launches_that_depend_on_the_values_differ_between_two_recordings():
    plans = []
    for seed in range(40):
        inputs, outputs = call_set(seed)
        plans.append((float(inputs["x"][0, 0]) > 0, record_call(branch_on_values, inputs, outputs, KERNELS)))
    positive = next(p for sign, p in plans if sign)
    negative = next(p for sign, p in plans if not sign)
    said = differences(positive, negative)
    assert said and "grid (2, 1, 1)" in said[0] and "grid (3, 1, 1)" in said[0], said


@pytest.mark.parametrize("work, op", [
    (lambda x, y: y.copy_(x), "aten.copy_"),
    (lambda x, y: y.fill_(float(x.max().item())), "aten.max"),
    (lambda x, y: torch.mul(x, 2, out=y), "aten.mul"),
])
def test_tensor_work_on_the_host_refuses_the_plan_and_names_the_operator(work, op):
    def run(x, w, eps, y, s, *, kernels):
        work(x, y)
        kernels.rows(x, y, grid=1, block=1)

    plan = record_call(run, *call_set(), KERNELS)
    assert plan.refused and op in plan.refused and plan.steps == []


def test_views_fills_and_allocations_with_a_constant_are_not_work():
    def run(x, w, eps, y, s, *, kernels):
        y.view(-1)[16:32].fill_(2.0)
        z = torch.zeros(5)
        t = x.t()[1]
        kernels.rows(z, t, x.reshape(-1)[3:], grid=1, block=1)

    plan = record_call(run, *call_set(), KERNELS)
    assert plan.refused is None, plan.refused
    first, zeros, launch = plan.steps
    assert first == Fill(buffer=BufferArg(kind="output", name="y", offset_bytes=64), size_bytes=64,
                         dtype="float32", value=2.0)
    assert zeros.buffer == BufferArg(kind="scratch", index=0) and zeros.size_bytes == 20
    assert launch.args == [BufferArg(kind="scratch", index=0), BufferArg(kind="input", name="x", offset_bytes=4),
                           BufferArg(kind="input", name="x", offset_bytes=12)]


def test_a_fill_of_an_input_refuses_the_plan():
    def run(x, w, eps, y, s, *, kernels):
        w.zero_()

    assert "fills input `w`" in record_call(run, *call_set(), KERNELS).refused


def test_raw_pointers_are_resolved_into_a_buffer_or_refused():
    def good(x, w, eps, y, s, *, kernels):
        kernels.rows(np.uintp(y.data_ptr() + 8), grid=1, block=1)

    assert record_call(good, *call_set(), KERNELS).steps[0].args == [BufferArg(kind="output", name="y", offset_bytes=8)]

    def nowhere(x, w, eps, y, s, *, kernels):
        kernels.rows(np.uintp(4096), grid=1, block=1)

    assert "into none of the call's buffers" in record_call(nowhere, *call_set(), KERNELS).refused

    def disguised(x, w, eps, y, s, *, kernels):
        kernels.rows(np.int64(x.data_ptr()), grid=1, block=1)

    # Only integers above 4 GiB are taken for addresses (device memory always is; small scalars never
    # are). A CPU tensor of 64 MiB is mapped there too, whatever the Python (a non-PIE one's heap is low).
    assert "address of a buffer" in record_call(disguised, *call_set(n=1 << 20), KERNELS).refused


def test_a_tensor_from_before_the_call_refuses_the_plan_even_where_the_solution_catches_it():
    kept = torch.zeros(64)

    def run(x, w, eps, y, s, *, kernels):
        try:
            kernels.rows(kept, grid=1, block=1)
        except Exception:
            pass
        kernels.rows(x, grid=1, block=1)

    plan = record_call(run, *call_set(), KERNELS)
    assert plan.refused and "none of the call's inputs, outputs or scratch" in plan.refused


def test_a_kernel_the_cubin_lacks_is_an_attribute_error_as_in_process():
    def run(x, w, eps, y, s, *, kernels):
        kernels.not_there(x, grid=1, block=1)

    with pytest.raises(AttributeError, match="no kernel `not_there`"):
        record_call(run, *call_set(), KERNELS)
    assert KERNELS.defines("rows") and not KERNELS.defines("not_there")


def test_returned_tensors_are_views_of_buffers():
    def run(x, w, eps, *, kernels):
        out = torch.empty(x.numel() + 4)
        kernels.rows(x, out, grid=1, block=1)
        return out[4:].view(x.shape), out[:2]

    inputs, _ = call_set()
    plan = record_call(run, inputs, None, KERNELS)
    assert plan.refused is None
    first, second = plan.returned
    assert first.buffer == BufferArg(kind="scratch", index=0, offset_bytes=16)
    assert (first.shape, first.stride, first.dtype) == ([8, 16], [16, 1], "float32")
    assert second.buffer == BufferArg(kind="scratch", index=0) and second.shape == [2]


def test_returned_dicts_are_read_in_the_definitions_order():
    def run(x, w, eps, *, kernels):
        a, b = torch.empty(4), torch.empty(8)
        kernels.rows(a, b, grid=1, block=1)
        return {"second": b, "first": a}

    plan = record_call(run, call_set()[0], None, KERNELS, ["first", "second"])
    assert [r.shape for r in plan.returned] == [[4], [8]]

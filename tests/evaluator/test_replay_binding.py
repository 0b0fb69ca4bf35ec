"""The timer's replay entry (timer/replay.py) against a fake launcher: the pointers and scalars it
passes per call, scratch made once per workload (but returned scratch, fresh per call), fills done
on the call's own buffers. Plans come from the recorder, as in an attempt."""

from __future__ import annotations

import numpy as np
import torch

from services.evaluator.harness.recorder import RecordingKernels
from services.evaluator.harness.recorder import record_call
from services.evaluator.timer.replay import ReplayEntry


class FakeLauncher:
    """Kernel NAME launched: its arguments as the launcher gets them, kept in order."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args, grid, block, shared_mem: self.calls.append((name, args, grid, block, shared_mem))


def run(x, w, eps, y, *, kernels):
    partial = torch.empty(64, dtype=torch.float32, device=x.device)
    partial.zero_()
    y.view(-1)[:4].fill_(3.0)
    kernels.rows(x, w[2:], y[1:], partial, x.shape[0], eps, grid=(x.shape[0],), block=(64,), shared_mem=256)


def inputs(seed: int, eps: float = 1e-5) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(5, 8, generator=g), "w": torch.randn(8, generator=g), "eps": eps}


def entry(plan, destination_passing: bool = True, outputs: tuple = ("y",)) -> tuple[ReplayEntry, FakeLauncher]:
    fake = FakeLauncher()
    replay = ReplayEntry({"w1": plan}, ["x", "w", "eps"], list(outputs), fake, torch.device("cpu"), destination_passing)
    replay.select("w1")
    return replay, fake


def test_each_call_gets_pointers_into_its_own_buffers_and_scalars_of_their_width():
    eps = 2.5e-4
    plan = record_call(run, inputs(0, eps), {"y": torch.empty(5, 8)}, RecordingKernels(frozenset({"rows"})))
    assert plan.refused is None
    replay, fake = entry(plan)
    scratch = []
    for seed in (1, 2):
        call = inputs(seed, eps)
        y = torch.full((5, 8), float("nan"))
        assert replay(*call.values(), y) is None
        name, args, grid, block, shared = fake.calls[-1]
        assert (name, grid, block, shared) == ("rows", (5, 1, 1), (64, 1, 1), 256)
        assert [type(a) for a in args] == [np.uintp] * 4 + [np.int32, np.float32]
        assert int(args[0]) == call["x"].data_ptr()
        assert int(args[1]) == call["w"].data_ptr() + 8
        assert int(args[2]) == y.data_ptr() + 32
        assert args[4] == 5 and args[5] == np.float32(eps)
        scratch.append(int(args[3]))
        assert torch.equal(y.view(-1)[:4], torch.full((4,), 3.0)) and y.view(-1)[4:].isnan().all()
    assert scratch[0] == scratch[1]  # made once per workload
    partial = replay._bound.scratch[0]
    assert partial.numel() == 256 and not partial.any()  # the zero_ replayed on it


def test_a_scalar_input_is_taken_from_each_call():
    plan = record_call(run, inputs(0, 1e-5), {"y": torch.empty(5, 8)}, RecordingKernels(frozenset({"rows"})))
    replay, fake = entry(plan)
    replay(*inputs(3, 0.125).values(), torch.empty(5, 8))
    assert fake.calls[-1][1][5] == np.float32(0.125)


def test_returned_scratch_is_fresh_per_call_and_shaped_as_recorded():
    def returns(x, w, eps, *, kernels):
        out = torch.empty(x.numel() + 8)
        kernels.rows(x, out, grid=1, block=1)
        return out[8:].view(x.shape)

    plan = record_call(returns, inputs(0), None, RecordingKernels(frozenset({"rows"})))
    replay, fake = entry(plan, destination_passing=False)
    first, = replay(*inputs(1).values())
    second, = replay(*inputs(2).values())
    assert first.shape == (5, 8) and first.dtype == torch.float32
    assert int(fake.calls[0][1][1]) + 32 == first.data_ptr()
    assert int(fake.calls[1][1][1]) + 32 == second.data_ptr()
    assert first.data_ptr() != second.data_ptr()

"""Persisting L2 lines reset before every timed run's flush (a cache-residency game on a GPU: lines
marked persisting survive a flush; docs/results/hardening.md). Here a stand-in for cuda-python's
runtime and for the device calls around a run; bench/persisting_l2.py measures the effect on an H200.
The same stand-in checks the flush itself: written, then read back, and its own CUPTI records counted."""

from __future__ import annotations

from types import ModuleType, SimpleNamespace

import pytest
import torch

from services.evaluator.harness import timing
from services.evaluator.harness.guards import Guard


def fake_runtime(log: list[str], error: int = 0, missing: bool = False) -> ModuleType:
    runtime = ModuleType("fake_cudart")
    runtime.cudaError_t = SimpleNamespace(cudaSuccess=0)
    if not missing:
        def reset():  # the binding returns a one-tuple: (error,)
            log.append("reset")
            return (error,)
        runtime.cudaCtxResetPersistingL2Cache = reset
    return runtime


DRIVER = ModuleType("fake_cuda_driver")  # the binding's other half (the GPU hand-over's), unused here


@pytest.fixture
def bound(monkeypatch):
    def install(runtime):
        monkeypatch.setattr(timing, "_CUDA", [(DRIVER, runtime) if runtime is not None else None])
        return runtime
    return install


@pytest.mark.parametrize(("error", "missing", "done"), [(0, False, True), (1, False, False), (0, True, False)],
                         ids=["reset", "error", "older_binding"])
def test_reset_says_whether_it_was_done(bound, error, missing, done):
    log: list[str] = []
    bound(fake_runtime(log, error, missing))
    assert timing.reset_persisting_l2() is done
    assert log == ([] if missing else ["reset"])


def test_without_cuda_python_nothing_is_reset(bound):
    bound(None)
    assert timing.reset_persisting_l2() is False


class Recorded:
    """A stand-in for what `_GpuClock.time` touches on the device, in the order it is touched."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def fill_(self, _value):
        self.log.append("flush")

    def max(self):
        self.log.append("read back")

    def start(self):
        self.log.append("window")

    kernels: tuple[str, ...] = ()

    def stop_span_ms(self, skip: int = 0):
        return 1.0


def gpu_clock(log: list[str], monkeypatch) -> timing._GpuClock:
    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            pass

        def record(self):
            log.append("event")

        def elapsed_time(self, _other):
            return 1.0

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda _cycles: log.append("spin"))
    monkeypatch.setattr(timing, "synchronize", lambda _device: None)
    clock = object.__new__(timing._GpuClock)  # no device here: its fields set by hand
    clock.device, clock.scratch, clock.cupti, clock.spin_cycles = torch.device("cuda"), Recorded(log), Recorded(log), 0
    clock.l2_reset, clock.samples, clock.event_samples, clock.cupti_samples = True, [], [], []
    clock.kernels, clock.own_launches = set(), 2
    return clock


def test_every_run_resets_persisting_lines_before_its_flush(bound, monkeypatch):
    log: list[str] = []
    bound(fake_runtime(log))
    clock = gpu_clock(log, monkeypatch)
    for i in range(3):
        clock.time(lambda _i: log.append("run"), i)
    assert log == ["reset", "window", "flush", "read back", "spin", "event", "run", "event"] * 3
    assert clock.latency().l2_persisting_reset is True


def test_a_run_without_the_reset_is_said_in_the_trace(bound, monkeypatch):
    log: list[str] = []
    bound(fake_runtime(log))
    clock = gpu_clock(log, monkeypatch)
    clock.time(lambda _i: None, 0)
    bound(fake_runtime(log, error=1))
    clock.time(lambda _i: None, 1)
    latency = clock.latency()
    assert latency.l2_persisting_reset is False and latency.as_dict()["l2_persisting_reset"] is False


def test_on_a_cpu_device_nothing_is_bound():
    before = list(timing._CUDA)
    timing.bind_runtime(torch.device("cpu"))
    assert timing._CUDA == before


def test_a_solution_that_swaps_the_runtime_is_caught(bound):
    log: list[str] = []
    bound(fake_runtime(log))
    guard = Guard()
    assert guard.check_call() is None and guard.check() is None
    timing._CUDA[0] = (DRIVER, fake_runtime(log))  # in place: the name `_CUDA` still holds the same list
    for message in (guard.check_call(), guard.check()):
        assert "resets L2" in message


def test_a_solution_that_replaces_the_reset_is_caught(bound):
    log: list[str] = []
    runtime = bound(fake_runtime(log))
    guard = Guard()
    runtime.cudaCtxResetPersistingL2Cache = lambda: (0,)
    assert "cudaCtxResetPersistingL2Cache" in guard.check()


class Counted(Recorded):
    """A recorder whose windows hold `counts` records in turn, and which keeps the `skip` it is asked for."""

    def __init__(self, log: list[str], counts: list[int]) -> None:
        super().__init__(log)
        self.counts, self.records, self.skips = iter(counts), 0, []

    def stop_span_ms(self, skip: int = 0):
        self.records = next(self.counts)
        self.skips.append(skip)
        return 1.0


def test_the_timers_own_records_are_counted_on_bare_windows_until_two_agree(monkeypatch):
    log: list[str] = []
    clock = gpu_clock(log, monkeypatch)
    clock.cupti = Counted(log, [5, 4, 4, 9])  # a first window with lazy set-up work in it, then settled
    assert clock.count_own_launches() == 4
    assert log == ["window", "flush", "read back", "spin"] * 3  # three bare windows, nothing run in them
    clock.own_launches = 4
    clock.cupti.counts = iter([7])
    clock.time(lambda _i: None, 0)
    assert clock.cupti.skips[-1] == 4  # a timed window leaves out that many records, the flush's and the spin's


def test_own_records_that_never_settle_stop_the_timing(monkeypatch):
    clock = gpu_clock([], monkeypatch)
    clock.cupti = Counted([], [2, 3, 4, 5, 6, 7])
    with pytest.raises(RuntimeError, match=r"do not settle: \[2, 3, 4, 5, 6\]"):
        clock.count_own_launches()

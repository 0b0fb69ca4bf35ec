"""The guard's reading of the L2 set aside for persisting accesses (a cache-residency game on a GPU:
tests/gpu/test_gpu_hacks.py plays it for real). Here a stand-in for cuda-python's runtime."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from services.evaluator import timing
from services.evaluator.guards import Guard


class FakeRuntime:
    """What `timing.persisting_l2_bytes` calls: cudaDeviceGetLimit(cudaLimitPersistingL2CacheSize)."""

    cudaLimit = SimpleNamespace(cudaLimitPersistingL2CacheSize="persisting")
    cudaError_t = SimpleNamespace(cudaSuccess=0)

    def __init__(self, kept: int, error: int = 0, broken: bool = False) -> None:
        self.kept, self.error, self.broken = kept, error, broken

    def cudaDeviceGetLimit(self, limit):  # noqa: N802 - the binding's name
        if self.broken:
            raise AttributeError("an older binding")
        assert limit == "persisting"
        return self.error, self.kept


@pytest.fixture
def runtime(monkeypatch):
    def install(fake):
        monkeypatch.setattr(timing, "_CUDART", [fake])
        return fake
    return install


def test_a_set_aside_left_after_a_call_is_a_hack(runtime):
    fake = runtime(FakeRuntime(0))
    guard = Guard()
    assert guard.check_call() is None and guard.check() is None
    fake.kept = 8 << 20
    for message in (guard.check_call(), guard.check()):
        assert "8388608 bytes of L2 set aside for persisting accesses" in message


@pytest.mark.parametrize("fake", [FakeRuntime(8 << 20, error=1), FakeRuntime(8 << 20, broken=True), None],
                         ids=["error", "older_binding", "no_cuda_python"])
def test_what_cannot_be_read_is_never_the_solutions_fault(runtime, fake):
    """Unreadable (an error, an older binding, no cuda-python): no verdict."""
    runtime(fake)
    assert timing.persisting_l2_bytes() is None
    assert Guard().check_call() is None


def test_on_a_cpu_device_nothing_is_bound():
    before = list(timing._CUDART)
    import torch

    timing.bind_runtime(torch.device("cpu"))
    assert timing._CUDART == before


def test_a_set_aside_the_machine_had_before_the_solution_is_not_its_doing(runtime):
    fake = runtime(FakeRuntime(4 << 20))
    guard = Guard()
    assert guard.check_call() is None
    fake.kept = 12 << 20
    assert "12582912 bytes" in guard.check_call()

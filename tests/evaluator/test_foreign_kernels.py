"""A `cuda` solution whose timed runs run kernels its cubin does not define (PyTorch or a library
computing in its place) is REWARD_HACK (issue 10's "PyTorch or library fallback"). The parts that
run without a GPU: CUPTI's kernel names kept per window, less the timer's own (`timing.CuptiRecorder`,
with a stand-in for cupti-python), gathered over a workload's timed runs (`timing._GpuClock`), and
the verdict (`launch.foreign_kernels`). tests/gpu/test_cuda_language.py runs it end to end."""

from __future__ import annotations

from types import SimpleNamespace

from services.evaluator.languages import launch

from services.evaluator.harness import timing

KERNEL, MEMCPY, MEMSET = "kernel", "memcpy", "memset"


class FakeCupti:
    """Records launches as CUPTI would hand them back at a flush: kind, correlation id, times, name."""

    ActivityKind = SimpleNamespace(CONCURRENT_KERNEL=KERNEL, MEMCPY=MEMCPY, MEMSET=MEMSET)

    def __init__(self) -> None:
        self.pending: list[SimpleNamespace] = []
        self.correlation = 0

    def activity_register_callbacks(self, requested, completed) -> None:
        self.completed = completed

    def activity_enable(self, kind) -> None:
        pass

    def activity_disable(self, kind) -> None:
        pass

    def activity_flush_all(self, _flag) -> None:
        self.completed(self.pending)
        self.pending = []

    def launch(self, kind: str, name: str | None = None) -> None:
        self.correlation += 1
        start = self.correlation * 1000
        record = SimpleNamespace(kind=kind, correlation_id=self.correlation, start=start, end=start + 500)
        if name is not None:
            record.name = name
        self.pending.append(record)


def test_the_recorder_keeps_the_kernel_names_of_a_window_less_the_timers_own() -> None:
    cupti = FakeCupti()
    recorder = timing.CuptiRecorder(cupti)
    recorder.start()
    cupti.launch(KERNEL, "flush")
    cupti.launch(KERNEL, "spin")
    cupti.launch(KERNEL, "scale")
    cupti.launch(MEMCPY)
    cupti.launch(KERNEL, "_ZN2at6native29vectorized_elementwise_kernel")
    assert recorder.stop_span_ms(skip=2) is not None
    assert recorder.kernels == ("_ZN2at6native29vectorized_elementwise_kernel", "scale")
    recorder.start()
    cupti.launch(KERNEL, "flush")
    cupti.launch(KERNEL, "spin")
    recorder.stop_span_ms(skip=2)
    assert recorder.kernels == ()  # each window its own


def test_a_workloads_kernels_are_those_of_all_its_timed_runs(monkeypatch) -> None:
    from test_persisting_l2 import gpu_clock

    runs = iter([("scale",), ("scale", "helper"), ()])

    class Recorder:
        kernels: tuple[str, ...] = ()

        def start(self) -> None:
            self.kernels = next(runs)

        def stop_span_ms(self, skip: int = 0) -> float:
            return 1.0

    clock = gpu_clock([], monkeypatch)  # no device here: its fields set by hand
    clock.cupti = Recorder()
    for i in range(3):
        clock.time(lambda _i: None, i)
    assert clock.latency().kernels == ("helper", "scale")
    assert "kernels" not in clock.latency().as_dict()  # the names stay out of the trace


def test_only_the_cubins_own_kernels_and_fills_pass() -> None:
    own = {"scale", "helper"}.__contains__
    assert launch.foreign_kernels(("scale", "helper"), own) is None
    assert launch.foreign_kernels((), own) is None
    fill = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_"
    assert launch.foreign_kernels(("scale", fill), own) is None  # a buffer zeroed by torch: set-up, not the work
    torch_mul = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_13BinaryFunctorIfffNS0_15binary_internal10MulFunctorIfEEEE"
    cublas = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
    verdict = launch.foreign_kernels(("scale", torch_mul, cublas), own)
    assert verdict is not None and "does not define" in verdict
    assert "MulFunctor" in verdict and "sm90_xmma_gemm" in verdict
    many = launch.foreign_kernels([f"k{i}" for i in range(7)], own)
    assert many is not None and "and 3 more" in many


def test_a_solution_that_silences_the_check_is_caught(monkeypatch) -> None:
    """The check runs in the candidate's process: rebinding it (or the cubin's lookup) is a guarded patch."""
    from services.evaluator.harness import candidate as child
    from services.evaluator.harness.guards import Guard

    guard = Guard()
    assert guard.check() is None
    for owner, name in ((launch, "foreign_kernels"), (child, "foreign_kernels"), (launch.Kernels, "defines")):
        with monkeypatch.context() as patched:
            patched.setattr(owner, name, lambda *_args: None)
            message = guard.check()
            assert message is not None and name in message, (owner, name, message)
    assert guard.check() is None

"""The evaluator's knobs for one attempt (`EvalConfig`): how many rounds, sets and runs, its
limits, and which of its defences are on. Built from `Settings` in the service (`from_settings`),
directly in tests and benches."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from services.evaluator.languages.nvcc import BuildCache
from services.evaluator.outer_clock import SLACK_MS
from services.evaluator.retime import RETIMES
from services.evaluator.spares import Spares
from shared.hardware import HardwareSpec
from shared.settings import Settings


@dataclass(frozen=True)
class EvalConfig:
    device: str
    correctness_rounds: int = 3
    timing_sets: int = 3  # timed input sets per workload at least (one per timed run while `timed_bytes` allows)
    warmup_runs: int = 2
    timing_runs: int = 20
    timing_budget_s: float = 1.0
    attempt_timeout_s: float = 300.0  # the candidate child's hard limit
    scratch_dir: Path | None = None
    build_cache: BuildCache | None = None  # cubins by build key (the object store)
    arch: str | None = None  # nvcc target; default: the device's own (sm_90a on an H200)
    hardware: HardwareSpec | None = None  # SOL ceilings; default: the row of the CUDA device, none on a CPU
    measure_compile: bool = False  # time torch.compile on the reference too (T_b), when not cached
    compile_baselines: dict[str, float | None] | None = None  # cached torch.compile times (None: fails)
    reference_timeout_s: float = 240.0  # the reference child's limit, torch.compile included (KERNELSWARM_REFERENCE_TIMEOUT_S)
    workload_timeout_s: float | None = 120.0  # the candidate killed when one workload takes longer
    spares: Spares | None = None  # children started ahead (the evaluator service); None: start on demand
    fork_server: bool = True  # children forked from a warm fork server (`isolation.start_child`)
    timed_bytes: int = 256 << 20  # beyond `timing_sets`, a workload's timed sets (inputs and outputs) stay under this
    # Random input sets made again in the candidate from their seeds instead of passed as files.
    # None: on a GPU only, where drawing a set takes milliseconds; on a CPU, mapping a file from
    # /dev/shm is faster than drawing it again (12 workloads: 8.5 s with files, 10.2 s drawn).
    regenerate_inputs: bool | None = None
    # The evaluator times each workload's timed batch itself (`outer_clock`): a window on its own
    # clock that the candidate's process cannot write, the timed sets handed over only at its start.
    # On for every device: the thresholds were set on a CPU; on the H200 128 honest workloads of
    # the library's `cuda` seeds used at most 22% of their allowance (docs/results/hardening.md).
    outer_clock: bool = True
    # A window over its allowance is timed again on fresh input sets, up to this many times; where
    # none fits, the workload passes charged what the outer clock vouches for (`retime`), never
    # REWARD_HACK (KERNELSWARM_OUTER_CLOCK_RETIMES).
    outer_clock_retimes: int = RETIMES
    # The allowance's slack per workload (`outer_clock.allowed_ms`); tests shrink it to force re-times.
    outer_clock_slack_ms: float = SLACK_MS
    # On a GPU with the outer clock on: the candidate's output sets go to the checker in GPU memory
    # (CUDA IPC, `gpu_handover`) instead of files. Off: files, as on a CPU.
    gpu_handover: bool = True
    # On a device timed by the host's clock (the CPU), where no physical floor applies: a median
    # below half the shortest call that clock can time here is REWARD_HACK (`score.below_the_host_clock`).
    host_clock_floor: bool = True
    # Language `cuda`: its launch.py runs only in a record step and a child that imports none of its
    # Python replays the launch plans and times them (`timer/`). Off: timed in its own process.
    replay: bool = True
    # The `profile` tool's hook (`tools.profile`): called with the record step's `timer.route.Routed`
    # and the `languages.build.Build`, once the plans are judged and before anything is timed.
    probe: Callable[..., None] | None = None

    @property
    def regenerates_inputs(self) -> bool:
        return self.regenerate_inputs if self.regenerate_inputs is not None else self.device.startswith("cuda")

    @classmethod
    def from_settings(cls, settings: Settings, device: str | None = None,
                      build_cache: BuildCache | None = None) -> EvalConfig:
        return cls(device or settings.device, max(1, settings.correctness_rounds), max(1, settings.timing_sets),
                   settings.warmup_runs, max(3, settings.timing_runs), settings.timing_budget_s,
                   settings.attempt_timeout_s, settings.scratch_dir, build_cache,
                   workload_timeout_s=settings.workload_timeout_s, fork_server=settings.fork_server,
                   reference_timeout_s=settings.reference_timeout_s,
                   outer_clock_retimes=max(0, settings.outer_clock_retimes))

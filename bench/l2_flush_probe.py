"""What the state the L2 flush leaves does to a kernel's time, on the clock the evaluator uses (CUPTI).

Until 2026-12-04 the evaluator flushed the L2 before every timed run by writing a buffer of twice
its size: that leaves about one L2 of dirty lines, which a memory-bound kernel then writes back.
Nsight Compute invalidates the caches instead, and on the H200 (2026-12-03) a 64 MiB float32 add
read 48.8 us in the evaluator against 44.7 us under ncu; GEMMs agreed within 1%. This probe's run
of 2026-12-04 (docs/results/2026-12-04-l2-flush-probe-h200.txt) made the clean flush below the
evaluator's (`timing._GpuClock.flush`). It times each kernel of `evaluator_fidelity.py` under four
states before the run, one kernel call at a time, as the evaluator does (synchronize, flush, a spin
so that the launch is queued, the call): the flush that only writes (`dirty`), the same write
followed by a read of the whole buffer (`clean`, the evaluator's now: the dirty lines go back to
memory before the run), and each with the same inputs every run (`same`) or fresh copies at new
addresses (`fresh`, as the evaluator's timed runs).

    python bench/l2_flush_probe.py --out l2-flush-probe.json [--kernels add_16m,gemm_8k_bf16] [--runs 50]

The run's time is the CUPTI span of the records after the flush's and the spin's own: their
number is counted first, on a window with nothing else in it (printed as `own`). Prints a table,
writes JSON. Needs a GPU and cupti-python.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evaluator_fidelity import KERNELS, call_on, make_tensors  # noqa: E402
from services.evaluator.harness import timing  # noqa: E402

SPIN_CYCLES = 100_000  # about 50 us at 2 GHz: the call is queued before the GPU reaches it
STATES = ("dirty/same", "dirty/fresh", "clean/same", "clean/fresh")


class Recorder(timing.CuptiRecorder):
    def records(self) -> list[tuple[int, int, int]]:
        """After a synchronize: the window's records (correlation id, start ns, end ns), in launch order."""
        for kind in self._kinds:
            self._cupti.activity_disable(kind)
        self._cupti.activity_flush_all(1)
        spans, self._spans = sorted(self._spans), []
        return spans


def flush(scratch: torch.Tensor, clean: bool) -> None:
    scratch.fill_(0x5A5A5A5A)
    if clean:
        scratch.max()  # reads it all: the written lines leave the L2, clean ones take their place


def window(recorder: Recorder, scratch: torch.Tensor, clean: bool, call=None) -> list[tuple[int, int, int]]:
    """One run as the evaluator times it (synchronize, flush, spin, the call), and its records."""
    torch.cuda.synchronize()
    recorder.start()
    flush(scratch, clean)
    torch.cuda._sleep(SPIN_CYCLES)
    if call is not None:
        call()
    torch.cuda.synchronize()
    return recorder.records()


def time_state(recorder: Recorder, scratch: torch.Tensor, name: str, state: str, runs: int) -> dict:
    kind, inputs = state.split("/")
    clean = kind == "clean"
    own = [len(window(recorder, scratch, clean)) for _ in range(2)][-1]  # the flush's and the spin's, settled
    x, y, out = make_tensors(name)
    samples = []
    for i in range(-3, runs):  # three warm-up runs
        if inputs == "fresh":
            x, y, out = x.clone(), y.clone(), torch.empty_like(out)
        spans = window(recorder, scratch, clean, lambda: call_on(name, x, y, out))[own:]
        if i >= 0 and spans:
            samples.append((max(e for _, _, e in spans) - min(s for _, s, _ in spans)) / 1e3)
    return {"kernel": name, "state": state, "own_records": own, "runs": len(samples),
            "median_us": statistics.median(samples) if samples else None,
            "min_us": min(samples, default=None), "max_us": max(samples, default=None)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("l2-flush-probe.json"))
    parser.add_argument("--kernels", default=",".join(KERNELS), help="comma-separated subset")
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    unknown = [k for k in args.kernels.split(",") if k not in KERNELS]
    if unknown:
        raise SystemExit(f"unknown kernels {unknown}; known: {', '.join(KERNELS)}")
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    from cupti import cupti

    recorder = Recorder(cupti)
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
    scratch = torch.empty(2 * l2_bytes // 4, dtype=torch.int32, device="cuda")
    rows = []
    for name in args.kernels.split(","):
        for state in STATES:
            rows.append(time_state(recorder, scratch, name, state, args.runs))
            print(json.dumps(rows[-1]), flush=True)
    report = {"date": datetime.now(timezone.utc).isoformat(), "hardware": torch.cuda.get_device_name(),
              "l2_bytes": l2_bytes, "command": " ".join(["python", *sys.argv]), "rows": rows}
    args.out.write_text(json.dumps(report, indent=2))
    print(f"\nL2 state before each run, {report['hardware']} (L2 {l2_bytes >> 20} MiB), CUPTI span, us")
    print(f"{'kernel':16} " + " ".join(f"{s:>12}" for s in STATES) + "   own records (dirty, clean)")
    for name in args.kernels.split(","):
        mine = {r["state"]: r for r in rows if r["kernel"] == name}
        cells = " ".join(f"{mine[s]['median_us']:>12.2f}" if mine[s]["median_us"] else f"{'-':>12}" for s in STATES)
        print(f"{name:16} {cells}   {mine['dirty/same']['own_records']}, {mine['clean/same']['own_records']}")


if __name__ == "__main__":
    main()

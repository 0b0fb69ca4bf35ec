"""The checker's comparison of one output on the CPU: a cached chunk at a time (`CPU_CHUNK`, what
the checker does) against one pass over the whole tensor (the same code with the chunk larger than
the tensor: what it did before), on outputs the size of the shipped problems' largest ones.

    python bench/compare_chunks.py --repeat 5 --out docs/results/DATE-compare-chunks-cpu.json

Both give the same figures (tests/evaluator/test_eval_correctness.py checks that); this measures
the time only (not the memory). Prints a table; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.evaluator.harness import correctness  # noqa: E402
from shared.schema import Tolerance  # noqa: E402

# name, shape, dtype: llama31_8b_swiglu's output at 512 tokens, an rmsnorm's at 512, a small one
CASES = [("swiglu 512x14336 bf16", (512, 14336), torch.bfloat16),
         ("rmsnorm 512x4096 bf16", (512, 4096), torch.bfloat16),
         ("fp32 8x4096", (8, 4096), torch.float32)]
TOLERANCE = Tolerance(max_atol=0.01, max_rtol=0.02, required_matched_ratio=0.999)


def timed(actual: torch.Tensor, expected: torch.Tensor, chunk: int, repeat: int) -> list[float]:
    correctness.CPU_CHUNK = chunk
    correctness.compare("y", actual, expected, TOLERANCE)  # warm-up
    seconds = []
    for _ in range(repeat):
        began = time.perf_counter()
        correctness.compare("y", actual, expected, TOLERANCE)
        seconds.append(time.perf_counter() - began)
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    chunk = correctness.CPU_CHUNK
    generator = torch.Generator().manual_seed(0)
    rows = []
    for name, shape, dtype in CASES:
        expected = torch.randn(shape, generator=generator).to(dtype)
        actual = (expected.float() + 1e-3 * torch.randn(shape, generator=generator)).to(dtype)
        whole = timed(actual, expected, 1 << 62, args.repeat)
        chunked = timed(actual, expected, chunk, args.repeat)
        rows.append({"case": name, "elements": expected.numel(), "whole_ms": 1e3 * statistics.median(whole),
                     "chunked_ms": 1e3 * statistics.median(chunked),
                     "whole_all_ms": [1e3 * s for s in whole], "chunked_all_ms": [1e3 * s for s in chunked]})
    correctness.CPU_CHUNK = chunk
    print(f"{'case':<24} {'elements':>10} {'whole ms':>10} {'chunked ms':>11} {'ratio':>7}")
    for row in rows:
        print(f"{row['case']:<24} {row['elements']:>10} {row['whole_ms']:>10.2f} {row['chunked_ms']:>11.2f} "
              f"{row['whole_ms'] / row['chunked_ms']:>6.2f}x")
    if args.out:
        args.out.write_text(json.dumps({
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "command": " ".join(sys.argv),
            "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                        "torch": torch.__version__, "threads": torch.get_num_threads()},
            "cpu_chunk": chunk, "repeat": args.repeat, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

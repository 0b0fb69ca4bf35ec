"""Does a line marked persisting in L2 outlive the timer's flush, and does the reset the timer now
does before every flush (`timing.reset_persisting_l2`) take it away? Issue 10's cache-residency game.

    python bench/persisting_l2.py --out persisting-l2.json

A buffer of `--mib` MiB (under the device's persisting set-aside once this raises the set-aside to
its maximum) is read once, with or without an access policy window over it on the current stream
(hit ratio 1, persisting: the window marks its lines persisting); then, as the case says, the
timer's reset (`cudaCtxResetPersistingL2Cache`) and its flush (a device-wide synchronize and a buffer
of twice L2's size overwritten); then one timed read of the buffer, with or without the window
(CUDA events, a sleep kernel ahead so that the host's launch is not timed). Every case starts from
a reset, so none inherits another's marks; cases interleave. The cases set the read from DRAM, the
game before the reset (marked, flush alone), the timer now (marked, reset and flush), the window's
own effect on the read (not marked), and the read from L2, side by side. Prints a table; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
from datetime import datetime, timezone
from pathlib import Path


def _first(owner, *names):
    for name in names:
        if hasattr(owner, name):
            return getattr(owner, name)
    raise AttributeError(f"none of {names} in {owner!r}")


def _checked(result, what: str):
    error = result[0] if isinstance(result, tuple) else result
    if int(error) != 0:
        raise RuntimeError(f"{what} failed: {error}")
    return result[1] if isinstance(result, tuple) and len(result) > 1 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=24, help="the buffer read (default 24 MiB)")
    parser.add_argument("--runs", type=int, default=200, help="timed reads per case (default 200)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    import torch
    from cuda.bindings import runtime as rt

    device = torch.device("cuda")
    torch.empty(1, device=device)
    props = _checked(rt.cudaGetDeviceProperties(0), "cudaGetDeviceProperties")
    limit = rt.cudaLimit.cudaLimitPersistingL2CacheSize
    default_set_aside = _checked(rt.cudaDeviceGetLimit(limit), "cudaDeviceGetLimit")
    _checked(rt.cudaDeviceSetLimit(limit, props.persistingL2CacheMaxSize), "cudaDeviceSetLimit")
    set_aside = _checked(rt.cudaDeviceGetLimit(limit), "cudaDeviceGetLimit")
    nbytes = min(args.mib << 20, props.accessPolicyMaxWindowSize, set_aside)
    nbytes = nbytes // (8192 * 4) * (8192 * 4)  # whole programs
    x = torch.randn(nbytes // 4, device=device)
    # The read: a Triton kernel, one program per 32 KiB, each writing its partial sum. Torch's
    # reductions were not bandwidth-bound here: on the H200 (2026-12-03) a sum to one scalar read
    # 24 MiB in about 27 us whether L2 was hot or flushed, row sums of 1024 floats in about 22 us
    # flushed and 20 us hot (about 1.1 TB/s), so neither could show where the lines came from. Nor
    # could this kernel alone (38 us flushed, 35 us hot): with the GPU idle at the start event, the
    # events timed the host's launch. A sleep kernel ahead of the start event takes that out.
    import triton
    import triton.language as tl

    @triton.jit
    def partial_sums(src, dst, BLOCK: tl.constexpr):
        program = tl.program_id(0)
        offsets = program * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + program, tl.sum(tl.load(src + offsets), axis=0))

    block = 8192
    out = torch.empty(x.numel() // block, device=device)

    def read() -> None:
        partial_sums[(out.numel(),)](x, out, BLOCK=block, num_warps=8)

    scratch = torch.empty(2 * props.l2CacheSize // 4, dtype=torch.int32, device=device)
    stream = torch.cuda.current_stream().cuda_stream

    attr_ids = _first(rt, "cudaStreamAttrID", "cudaLaunchAttributeID")
    window_attr = _first(attr_ids, "cudaStreamAttributeAccessPolicyWindow", "cudaLaunchAttributeAccessPolicyWindow")
    value_type = _first(rt, "cudaStreamAttrValue", "cudaLaunchAttributeValue")

    def window(size: int) -> None:
        value = value_type()
        policy = value.accessPolicyWindow
        policy.base_ptr = x.data_ptr()
        policy.num_bytes = size
        policy.hitRatio = 1.0
        policy.hitProp = rt.cudaAccessProperty.cudaAccessPropertyPersisting
        policy.missProp = rt.cudaAccessProperty.cudaAccessPropertyStreaming
        value.accessPolicyWindow = policy
        _checked(rt.cudaStreamSetAttribute(stream, window_attr, value), "cudaStreamSetAttribute")

    def timed_read(mark: bool, reset: bool, flush: bool, read_window: bool) -> float:
        # Each case starts from no persisting lines (a reset), whatever the case before it left.
        _checked(rt.cudaCtxResetPersistingL2Cache(), "cudaCtxResetPersistingL2Cache")
        window(nbytes if mark else 0)
        read()  # the read that marks the lines persisting (with the window)
        torch.cuda.synchronize()
        if reset:
            _checked(rt.cudaCtxResetPersistingL2Cache(), "cudaCtxResetPersistingL2Cache")
        if flush:
            scratch.fill_(0x5A5A5A5A)
        window(nbytes if read_window else 0)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(200_000)  # the GPU busy while the host launches: the events time the read alone
        start.record()
        read()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3

    cases = [  # (name, marked persisting, reset, flush, window on the timed read)
        ("DRAM: not marked, flush", False, False, True, False),
        ("marked, flush, window (no reset)", True, False, True, True),
        ("marked, reset + flush, window (timer now)", True, True, True, True),
        ("marked, reset + flush, no window", True, True, True, False),
        ("not marked, flush, window", False, False, True, True),
        ("L2 hot: not marked, no flush", False, False, False, False)]
    for _ in range(20):  # warm-up of every case
        for _name, *how in cases:
            timed_read(*how)
    samples: dict[str, list[float]] = {name: [] for name, *_ in cases}
    for _ in range(args.runs):  # interleaved: drift hits every case alike
        for name, *how in cases:
            samples[name].append(timed_read(*how))
    window(0)
    rows = [{"case": name, "median_us": round(statistics.median(s), 2), "min_us": round(min(s), 2),
             "p90_us": round(sorted(s)[int(0.9 * len(s))], 2),
             "median_gb_s": round(nbytes / statistics.median(s) / 1e3, 1)} for name, s in samples.items()]
    report = {"date": datetime.now(timezone.utc).isoformat(), "hardware": torch.cuda.get_device_name(device),
              "command": "python bench/persisting_l2.py " + f"--mib {args.mib} --runs {args.runs}",
              "buffer_bytes": nbytes, "l2_bytes": props.l2CacheSize, "default_set_aside_bytes": default_set_aside,
              "set_aside_bytes": set_aside, "max_window_bytes": props.accessPolicyMaxWindowSize,
              "runs": args.runs, "rows": rows}
    args.out.write_text(json.dumps(report, indent=1))
    print(f"{report['hardware']}: {nbytes / 2**20:.1f} MiB read; L2 {props.l2CacheSize / 2**20:.0f} MiB, "
          f"set-aside {default_set_aside / 2**20:.2f} MiB by default, {set_aside / 2**20:.2f} MiB here")
    print(f"{'case':44} {'median us':>10} {'min us':>8} {'p90 us':>8} {'GB/s':>7}")
    for row in rows:
        print(f"{row['case']:44} {row['median_us']:10.2f} {row['min_us']:8.2f} {row['p90_us']:8.2f} {row['median_gb_s']:7.0f}")


if __name__ == "__main__":
    main()

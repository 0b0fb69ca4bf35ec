"""Does a line marked persisting in L2 outlive the timer's flush, and does the reset the timer now
does before every flush (`timing.reset_persisting_l2`) take it away? Issue 10's cache-residency game.

    python bench/persisting_l2.py --out persisting-l2.json

A buffer of `--mib` MiB (under the device's persisting set-aside once this raises the set-aside to
its maximum) is read once with an access policy window over it on the current stream (hit ratio 1,
persisting), which marks its lines persisting; then the timer's way of emptying L2 before a run
(a device-wide synchronize and a buffer of twice L2's size overwritten), with or without the reset
first; then one timed read of the buffer (CUDA events). Cases: no window (the read from DRAM), the
window with the flush alone (what a solution gained before the reset), the window with reset and
flush (what the timer does now), and no flush at all (the read from L2). Prints a table; writes JSON.
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
    nbytes = min(args.mib << 20, props.accessPolicyMaxWindowSize, set_aside) // 4096 * 4096  # whole rows
    x = torch.randn(nbytes // 4, device=device)
    # The read: row sums of 1024 floats, bandwidth-bound (a sum to one scalar is not: on the H200,
    # 2026-12-03, it read 24 MiB in about 27 us whether L2 was hot or flushed, and showed nothing).
    rows = x.view(-1, 1024)
    out = torch.empty(rows.shape[0], device=device)
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

    def timed_read(with_window: bool, flush: bool, reset: bool) -> float:
        window(nbytes if with_window else 0)
        torch.sum(rows, dim=1, out=out)  # the read that marks the lines (with the window)
        torch.cuda.synchronize()
        if reset:
            _checked(rt.cudaCtxResetPersistingL2Cache(), "cudaCtxResetPersistingL2Cache")
        if flush:
            scratch.fill_(0x5A5A5A5A)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.sum(rows, dim=1, out=out)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3

    cases = [("no window, flush", False, True, False), ("window, flush alone", True, True, False),
             ("window, reset + flush (the timer now)", True, True, True), ("no flush (L2 hot)", False, False, False)]
    for _ in range(20):  # warm-up of every case
        for _name, *how in cases:
            timed_read(*how)
    samples: dict[str, list[float]] = {name: [] for name, *_ in cases}
    for _ in range(args.runs):  # interleaved: drift hits every case alike
        for name, *how in cases:
            samples[name].append(timed_read(*how))
    window(0)
    rows = [{"case": name, "median_us": round(statistics.median(s), 2), "min_us": round(min(s), 2),
             "p90_us": round(sorted(s)[int(0.9 * len(s))], 2)} for name, s in samples.items()]
    report = {"date": datetime.now(timezone.utc).isoformat(), "hardware": torch.cuda.get_device_name(device),
              "command": "python bench/persisting_l2.py " + f"--mib {args.mib} --runs {args.runs}",
              "buffer_bytes": nbytes, "l2_bytes": props.l2CacheSize, "default_set_aside_bytes": default_set_aside,
              "set_aside_bytes": set_aside, "max_window_bytes": props.accessPolicyMaxWindowSize,
              "runs": args.runs, "rows": rows}
    args.out.write_text(json.dumps(report, indent=1))
    print(f"{report['hardware']}: {nbytes / 2**20:.1f} MiB read; L2 {props.l2CacheSize / 2**20:.0f} MiB, "
          f"set-aside {default_set_aside / 2**20:.2f} MiB by default, {set_aside / 2**20:.2f} MiB here")
    print(f"{'case':40} {'median us':>10} {'min us':>8} {'p90 us':>8}")
    for row in rows:
        print(f"{row['case']:40} {row['median_us']:10.2f} {row['min_us']:8.2f} {row['p90_us']:8.2f}")


if __name__ == "__main__":
    main()

"""Can output sets go from a child to the evaluator in GPU memory (CUDA IPC) instead of files, and
what would it save? A probe for issue 3's turnaround, run before building it.

    python bench/cuda_ipc_probe.py --out ipc.json

A child process (as `nobody` when this runs as root, as the candidate does; `--same-user` keeps
the user) makes `--sets` output sets on the GPU, sizes spread log-uniformly over `--min-kib` ..
`--max-mib`, then hands them over two ways, timed on both sides:
- files: `tensorfile.save` of each set into a folder under /dev/shm, then `tensorfile.load` onto
  the GPU in this process (today's path);
- IPC: one `cudaIpcGetMemHandle` per set's allocation base (with the offset), sent over a pipe;
  this process opens each handle, copies the bytes into a tensor of its own, closes the handle,
  then answers so that the child may free them.
Every copy is compared with the child's digest (a sum) so a wrong offset cannot pass. Prints a
table; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _sizes(sets: int, min_kib: float, max_mib: float) -> list[int]:
    low, high = math.log(min_kib * 1024), math.log(max_mib * 1024 * 1024)
    return [int(math.exp(low + (high - low) * k / max(sets - 1, 1))) // 4 * 4 for k in range(sets)]


def child(args: argparse.Namespace) -> None:
    import torch
    from cuda.bindings import driver, runtime

    from services.evaluator.harness import tensorfile
    device = torch.device("cuda")
    tensors = [torch.rand(n // 4, device=device) for n in _sizes(args.sets, args.min_kib, args.max_mib)]
    torch.cuda.synchronize()
    digests = [float(t.double().sum()) for t in tensors]
    started = time.perf_counter()
    for k, t in enumerate(tensors):
        tensorfile.save({"y": t}, Path(args.folder) / f"s{k}.st")
    saved = time.perf_counter() - started
    started = time.perf_counter()
    handles = []
    for t in tensors:
        err, base, _size = driver.cuMemGetAddressRange(t.data_ptr())
        assert err == driver.CUresult.CUDA_SUCCESS, err
        err, handle = runtime.cudaIpcGetMemHandle(int(base))
        assert err == runtime.cudaError_t.cudaSuccess, err
        handles.append({"handle": bytes(handle.reserved).hex(), "offset": t.data_ptr() - int(base),
                        "nbytes": t.numel() * 4})
    exported = time.perf_counter() - started
    print(json.dumps({"uid": os.getuid(), "digests": digests, "handles": handles, "save_s": saved,
                      "export_s": exported}), flush=True)
    sys.stdin.readline()  # the evaluator has copied them: now they may go


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", type=int, default=256)
    parser.add_argument("--min-kib", type=float, default=4)
    parser.add_argument("--max-mib", type=float, default=64)
    parser.add_argument("--same-user", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("ipc.json"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)

    import torch
    from cuda.bindings import runtime

    from services.evaluator.harness import tensorfile
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    folder = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    os.chmod(folder, 0o777)
    drop = os.getuid() == 0 and not args.same_user
    command = [sys.executable, __file__, "--child", "--folder", folder, "--sets", str(args.sets),
               "--min-kib", str(args.min_kib), "--max-mib", str(args.max_mib)]
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                            user=65534 if drop else None, group=65534 if drop else None)
    made = json.loads(proc.stdout.readline())
    total = sum(h["nbytes"] for h in made["handles"])

    started = time.perf_counter()
    loaded = [tensorfile.load(Path(folder) / f"s{k}.st", "cuda")["y"] for k in range(args.sets)]
    torch.cuda.synchronize()
    load_s = time.perf_counter() - started
    files_ok = all(math.isclose(float(t.double().sum()), d, rel_tol=1e-9) for t, d in zip(loaded, made["digests"]))
    del loaded

    # Sets in one allocation of the child's caching allocator share its handle: each distinct
    # handle is opened once (a second open in the same context fails), all closed at the end.
    error, copies, open_s, copy_s, opened = None, [], 0.0, 0.0, {}
    try:
        for h in made["handles"]:
            t0 = time.perf_counter()
            if h["handle"] not in opened:
                handle = runtime.cudaIpcMemHandle_t()
                handle.reserved = bytes.fromhex(h["handle"])
                err, pointer = runtime.cudaIpcOpenMemHandle(handle, runtime.cudaIpcMemLazyEnablePeerAccess)
                if err != runtime.cudaError_t.cudaSuccess:
                    raise RuntimeError(f"cudaIpcOpenMemHandle: {err}")
                opened[h["handle"]] = int(pointer)
            t1 = time.perf_counter()
            mine = torch.empty(h["nbytes"] // 4, device="cuda")
            err, = runtime.cudaMemcpy(mine.data_ptr(), opened[h["handle"]] + h["offset"], h["nbytes"],
                                      runtime.cudaMemcpyKind.cudaMemcpyDeviceToDevice)
            if err != runtime.cudaError_t.cudaSuccess:
                raise RuntimeError(f"cudaMemcpy: {err}")
            t2 = time.perf_counter()
            open_s, copy_s = open_s + (t1 - t0), copy_s + (t2 - t1)
            copies.append(mine)
        t0 = time.perf_counter()
        for pointer in opened.values():
            runtime.cudaIpcCloseMemHandle(pointer)
        copy_s += time.perf_counter() - t0
    except Exception as failure:  # noqa: BLE001 - the probe reports whatever stopped it
        error = f"{type(failure).__name__}: {failure}"
    torch.cuda.synchronize()
    ipc_ok = error is None and all(math.isclose(float(t.double().sum()), d, rel_tol=1e-9)
                                   for t, d in zip(copies, made["digests"]))
    proc.stdin.write("taken\n")
    proc.stdin.flush()
    proc.wait(timeout=60)
    subprocess.run(["rm", "-rf", folder], check=False)

    report = {"date": datetime.now(timezone.utc).isoformat(), "hardware": torch.cuda.get_device_name(),
              "command": "python bench/cuda_ipc_probe.py" + (" --same-user" if args.same_user else "")
                         + f" --sets {args.sets} --min-kib {args.min_kib} --max-mib {args.max_mib}",
              "child_uid": made["uid"], "evaluator_uid": os.getuid(), "sets": args.sets, "bytes": total,
              "files": {"child_save_s": made["save_s"], "evaluator_load_s": load_s, "ok": files_ok},
              "ipc": {"child_export_s": made["export_s"], "evaluator_open_s": open_s, "evaluator_copy_close_s": copy_s,
                      "handles_opened": len(opened), "ok": ipc_ok, "error": error}}
    args.out.write_text(json.dumps(report, indent=1))
    print(f"{args.sets} sets, {total / 2**30:.2f} GiB, child uid {made['uid']} -> evaluator uid {os.getuid()}")
    print(f"{'path':6} {'child s':>8} {'evaluator s':>12} {'ok':>4}")
    print(f"{'files':6} {made['save_s']:>8.3f} {load_s:>12.3f} {str(files_ok):>4}")
    print(f"{'ipc':6} {made['export_s']:>8.3f} {open_s + copy_s:>12.3f} {str(ipc_ok):>4}"
          + (f"  {error}" if error else ""))


if __name__ == "__main__":
    main()

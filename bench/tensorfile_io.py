"""Saving an input set to a file and loading it back, with the two writers of the evaluator's file:
`safetensors` (safetensors' `save_file`, as `tensorfile.save` wrote until 2026-12-03: a GPU tensor is
copied whole into pageable host memory, and by older safetensors releases into a bytes object too,
before it is written) against
`tensorfile` (`tensorfile.save` now: the same bytes, written from a CPU tensor's own memory or, for a
GPU tensor, through one pinned staging buffer of at most 64 MiB, a chunk at a time). The question it
answers on a GPU: how much of the reference child's time writing sets (7 s of a 15 s attempt on the
H200, 2026-12-03, at 0.7 GB/s) the library's copies cost.

    python bench/tensorfile_io.py --device cpu --sizes-mib 64,512,1300 --out tensorfile-io.json
    python bench/tensorfile_io.py --device cuda --sizes-mib 64,512,1300 --out tensorfile-io.json

Each case runs in a fresh process (so its peak resident memory is its own): one bf16 tensor of the
given size on the device, saved to the scratch folder the evaluator uses (/dev/shm where it has
room), loaded back onto the device; the median of `--repeats` saves and loads, and the process's
peak resident memory over its start (mapped pages of the loaded file count). On a CPU the load only
maps the file, so its time is near zero there, and neither writer copies a CPU tensor (safetensors
0.8 writes from the tensor's pointer): on this 2-core VM both save at 1.7-2.4 GB/s, the same within
run-to-run noise (64 and 512 MiB, two runs, 2026-12-03). The difference is the GPU's. Prints a
table; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WRITERS = ("safetensors", "tensorfile")


def safetensors_save(values: dict, path: Path) -> None:
    """`tensorfile.save` as it was before 2026-12-03: the same file, written by safetensors' `save_file`."""
    import torch
    from safetensors.torch import save_file

    tensors, layout, seen = {}, {}, set()
    for name, value in values.items():  # tensors only: the bench's sets hold nothing else
        flat = value.detach().contiguous().reshape(-1)
        if flat.untyped_storage().data_ptr() in seen or flat.data_ptr() != flat.untyped_storage().data_ptr():
            flat = flat.clone()  # safetensors refuses tensors that share memory
        seen.add(flat.untyped_storage().data_ptr())
        tensors[name] = flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)
        layout[name] = {"kind": "tensor", "dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape)}
    save_file(tensors, str(path), metadata={"kernelswarm": json.dumps(layout)})


def one_case(device: str, mib: int, writer: str, repeats: int, folder: str) -> dict:
    import torch

    from services.evaluator.harness import tensorfile

    tensor = torch.empty(mib << 19, device=device, dtype=torch.bfloat16).normal_()  # no float32 temporary
    path = Path(folder) / f"set-{writer}.st"

    save = tensorfile.save if writer == "tensorfile" else safetensors_save
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    saves, loads = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        save({"x": tensor}, path)
        saves.append(time.perf_counter() - started)
        started = time.perf_counter()
        loaded = tensorfile.load(path, device)["x"]
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        loads.append(time.perf_counter() - started)
        assert torch.equal(loaded.view(torch.int16), tensor.view(torch.int16))
        del loaded
        path.unlink()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"device": device, "mib": mib, "writer": writer, "save_s": statistics.median(saves),
            "load_s": statistics.median(loads), "save_gbps": (mib << 20) / statistics.median(saves) / 1e9,
            "peak_rss_over_start_mib": (peak - base_rss) / 1024, "saves_s": saves, "loads_s": loads}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sizes-mib", default="64,512")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("tensorfile-io.json"))
    parser.add_argument("--case", help=argparse.SUPPRESS)  # device,mib,writer,repeats,folder: one case, JSON out
    args = parser.parse_args()
    if args.case:
        device, mib, writer, repeats, folder = args.case.split(",")
        print(json.dumps(one_case(device, int(mib), writer, int(repeats), folder)))
        return
    shm = Path("/dev/shm")
    rows = []
    with tempfile.TemporaryDirectory(prefix="ks-bench-", dir=shm if shm.is_dir() else None) as folder:
        for mib in (int(m) for m in args.sizes_mib.split(",")):
            for writer in WRITERS:
                done = subprocess.run([sys.executable, __file__, "--case",
                                       f"{args.device},{mib},{writer},{args.repeats},{folder}"],
                                      capture_output=True, text=True, cwd=REPO, check=True)
                rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(f"{mib} MiB {writer}: save {rows[-1]['save_s']:.3f} s load {rows[-1]['load_s']:.3f} s",
                      flush=True)
    report = {"date": datetime.now(timezone.utc).isoformat(), "device": args.device,
              "command": f"python bench/tensorfile_io.py --device {args.device} --sizes-mib {args.sizes_mib} "
                         f"--repeats {args.repeats}", "rows": rows}
    args.out.write_text(json.dumps(report, indent=2))
    print(f"\n{'MiB':>6} {'writer':11} {'save s':>8} {'GB/s':>6} {'load s':>8} {'peak RSS MiB':>13}")
    for r in rows:
        print(f"{r['mib']:>6} {r['writer']:11} {r['save_s']:>8.3f} {r['save_gbps']:>6.2f} {r['load_s']:>8.3f} "
              f"{r['peak_rss_over_start_mib']:>13.0f}")


if __name__ == "__main__":
    main()

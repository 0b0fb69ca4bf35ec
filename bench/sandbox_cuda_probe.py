"""Does CUDA's driver initialise inside the candidate's private view (`fsview.private_view`), and
which part of the view stops it? Each variant runs in a new interpreter (CUDA not yet initialised):
it takes its part of the view, then calls cuInit and cuDeviceGetCount through libcuda. Needs a
root evaluator's privileges (a mount namespace) and a GPU.

    python bench/sandbox_cuda_probe.py --out sandbox-cuda-probe.json

Prints a table (variant, whether its part of the view was taken, cuInit's result, devices seen);
writes JSON. CUDA error 304 is "OS call failed or operation not supported".
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.evaluator.sandbox import fsview, isolation as sandbox  # noqa: E402

VARIANTS = {
    "none": "no view",
    "namespace": "a mount namespace, nothing changed",
    "read_only_root": "every mount read-only, /proc too (the view at 9834229)",
    "read_only_but_proc": "every mount read-only but /proc",
    "cuda_view": "the CUDA view (SHARED_ON_CUDA: /proc's process entries writable, /dev/shm private)",
    "cuda_view_real_shm": "the CUDA view with the real /dev/shm (the view before 2026-12-04)",
    "cuda_view_nobody": "the CUDA view, then `nobody` (as a candidate on a root evaluator)",
    "cpu_view": "the CPU view (/proc wholly read-only)",
}


def _take(variant: str, own: Path) -> bool:
    lib = ctypes.CDLL(None, use_errno=True)

    def namespace() -> bool:
        return (lib.unshare(fsview.CLONE_NEWNS) == 0
                and lib.mount(None, b"/", None, fsview.MS_REC | fsview.MS_PRIVATE, None) == 0)

    def view(shared: tuple[str, ...]) -> bool:
        return fsview.private_view(fsview.encoded_view(sandbox.candidate_view((own,), shared)), lib)

    if variant == "none":
        return True
    if variant == "namespace":
        return namespace()
    if variant == "read_only_root":
        return namespace() and fsview._set_read_only(b"/", True, lib)
    if variant == "read_only_but_proc":
        return (namespace() and fsview._set_read_only(b"/", True, lib)
                and fsview._set_read_only(fsview.PROC, False, lib))
    if variant == "cuda_view_real_shm":
        return view(("/dev/shm", *sandbox.shared_folders("cuda")))
    if variant == "cpu_view":
        return view(sandbox.shared_folders("cpu"))
    taken = view(sandbox.shared_folders("cuda"))
    if variant == "cuda_view_nobody" and taken:
        uid, gid = sandbox.unprivileged_ids() or (65534, 65534)
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    return taken


def _one(variant: str, own: Path) -> dict:
    os.chdir(own)
    taken = _take(variant, own)
    cuda = ctypes.CDLL("libcuda.so.1")
    count = ctypes.c_int(0)
    init = cuda.cuInit(0)
    if init == 0:
        cuda.cuDeviceGetCount(ctypes.byref(count))
    return {"variant": variant, "taken": taken, "cuInit": init, "devices": count.value}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("sandbox-cuda-probe.json"))
    parser.add_argument("--variant", choices=sorted(VARIANTS), help=argparse.SUPPRESS)  # one, in this process
    parser.add_argument("--own", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(_one(args.variant, args.own)))
        return
    if os.geteuid() != 0:
        sys.exit("needs root: the view takes a mount namespace")
    rows = []
    for variant, meaning in VARIANTS.items():
        own = Path(tempfile.mkdtemp(dir="/dev/shm")) / "ks-att-probe" / "cand"
        own.mkdir(parents=True)
        os.chmod(own, 0o777)
        run = subprocess.run([sys.executable, __file__, "--variant", variant, "--own", str(own)],
                             capture_output=True, text=True, timeout=120)
        row = json.loads(run.stdout) if run.returncode == 0 else {"variant": variant, "error": run.stderr[-400:]}
        rows.append({**row, "meaning": meaning})
    print(f"{'variant':24s} {'view taken':>10s} {'cuInit':>6s} {'devices':>7s}  meaning")
    for row in rows:
        error = f"  failed: {row['error'].strip().splitlines()[-1]}" if "error" in row else ""
        print(f"{row['variant']:24s} {str(row.get('taken')):>10s} {str(row.get('cuInit')):>6s} "
              f"{str(row.get('devices')):>7s}  {row['meaning']}{error}")
    args.out.write_text(json.dumps({"date": datetime.now(timezone.utc).isoformat(), "command": " ".join(sys.argv),
                                    "rows": rows}, indent=2))


if __name__ == "__main__":
    main()

"""Limits of the evaluator's machine are the evaluator's fault, not the candidate's (issue 40, H2).

A candidate is promised a file size bound (`sandbox.confine.LIMITS`); the sandbox keeps the
evaluator's own lower soft limit for its children (`KEEP_TIGHTER`), so a machine started under
`prlimit --fsize` handed an honest solution "[Errno 27] File too large". At start the evaluator
raises its soft limit to its hard one (`lift_soft_limits`); where the machine still allows less
than the promise, or its scratch disk is (nearly) full, a failure that says EFBIG or ENOSPC is
the machine's: `machine_fault` names it and the attempt is retried (`EvaluatorFault`), never a
verdict. The text alone decides nothing: the machine's state is measured, so a candidate that
raises such an error itself, on a machine with room, keeps its RUNTIME_ERROR."""

from __future__ import annotations

import logging
import resource
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from services.evaluator.evaluate import AttemptResult
from services.evaluator.sandbox.confine import LIMITS
from shared.schema import Status

log = logging.getLogger(__name__)

FILE_TOO_LARGE = ("[Errno 27]", "File too large")  # EFBIG
DISK_FULL = ("[Errno 28]", "No space left on device")  # ENOSPC
MIN_FREE_BYTES = 1 << 30  # a scratch disk with less free is full for an attempt's purposes


@dataclass(frozen=True)
class MachineLimits:
    """What the evaluator's machine allows now: its own soft file size limit (None: none), the
    bound a candidate is promised, and the free space of the scratch disk."""

    file_size_bytes: int | None
    promised_file_size_bytes: int
    free_disk_bytes: int

    @classmethod
    def measure(cls, scratch: str | None) -> MachineLimits:
        """`scratch`: the attempt's scratch folder (`scratch.scratch_root`; None: the temp folder)."""
        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        where = Path(scratch or tempfile.gettempdir())
        folder = next((p for p in (where, *where.parents) if p.exists()), Path("/"))
        return cls(None if soft == resource.RLIM_INFINITY else soft, LIMITS[resource.RLIMIT_FSIZE],
                   shutil.disk_usage(folder).free)


def lift_soft_limits() -> None:
    """The evaluator's soft file size limit up to its hard one: its children are promised more."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
        log.info("file size limit raised from %s to the hard limit %s", soft, hard)


def machine_fault(result: AttemptResult, limits: MachineLimits) -> str | None:
    """Why `result`, a failure, is the machine's fault rather than the candidate's; None if it is not."""
    if result.status is Status.PASSED:
        return None
    texts = [result.message] + [t.evaluation.log or "" for t in result.traces
                                if t.evaluation.status is not Status.PASSED]
    said = " ".join(texts)
    small_limit = limits.file_size_bytes is not None and limits.file_size_bytes < limits.promised_file_size_bytes
    if small_limit and any(s in said for s in FILE_TOO_LARGE):
        return (f"the evaluator's machine limits files to {limits.file_size_bytes} bytes, below the "
                f"{limits.promised_file_size_bytes} a candidate is promised: File too large is its fault")
    if limits.free_disk_bytes < MIN_FREE_BYTES and any(s in said for s in DISK_FULL):
        return f"the evaluator's scratch disk is full ({limits.free_disk_bytes} bytes free): No space left is its fault"
    return None

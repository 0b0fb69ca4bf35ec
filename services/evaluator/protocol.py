"""What crosses the evaluator's process boundaries: the job the evaluator writes for each child
(`ReferenceJob`, `CandidateJob`: `job.json` in the child's home, read with `read_job`), each
workload's result a child reports (`WorkloadResult`, in its `result.json`), the private channel
between the evaluator and each child (its message size limits and one `send`), and the ready marker
a spare child leaves in its home.

Messages on the private channel are JSON objects, one per line. The outer clock's (`ready`, `go`,
`end`, `sealed` or `again`, `outer_clock.py`, `retime.py`) and the checker's (`checking`, `check`,
`more`, `quit` and their replies, `harness/checker.py`) share it: the reference's channel becomes the checker's at its
`checking` line. Imported by the host side and the harness alike: nothing here imports either.
"""

from __future__ import annotations

import errno
import json
import os
import socket
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter

from shared.schema import Definition, Workload
from shared.schema.base import Frozen

READY_FILE = ".ready"  # written by a spare child in its home once warm; the evaluator waits for it

# A workload a child could not run for a fault of the machine's, not of the code it ran: its own
# file I/O refused (`FAULT_ERRNOS`). Never a verdict: the evaluator retries the attempt later.
EVALUATOR_FAULT = "EVALUATOR_FAULT"
FAULT_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EMFILE, errno.ENFILE, errno.EDQUOT})


def is_fault(error: BaseException) -> bool:
    """Whether `error`, raised by the evaluator's or the harness's own I/O, is the machine's fault."""
    return isinstance(error, OSError) and error.errno in FAULT_ERRNOS

# The channel's limits: the longest line each side reads.
MAX_CHILD_LINE = 1 << 22  # the evaluator reads no longer line from a child (an `end` carries its sets' handles)
MAX_GO_LINE = 1 << 24  # the harness reads the evaluator's `go`: seeds and digests of every timed set
MAX_CHECK_REPLY = 1 << 16  # the evaluator reads the checker's verdict on one workload
MAX_CHECK_REQUEST = 1 << 22  # the checker reads a `check`: it carries the shared sets' handles
MAX_SETS_REPLY = 1 << 24  # the evaluator reads the checker's answer to `more`: every fresh set's seed and digest


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    """One message on a private channel: a JSON object on a line of its own."""
    sock.sendall(json.dumps(message).encode() + b"\n")


# Descriptors sent with a message (`send_with_fds`): at most this many ride on one `sendmsg` (the
# kernel's SCM_MAX_FD is 253); the rest follow on messages of one byte, `FDS_MORE`.
FDS_PER_MESSAGE = 250
FDS_MORE = b"+"


def send_with_fds(sock: socket.socket, message: dict[str, Any], fds: list[int]) -> None:
    """`message` (which says how many descriptors follow: `receive_with_fds`) and `fds` with it: the
    checker, in a view of the file system that does not show the candidate's folder and as a user
    that may not read it, gets each output file already open."""
    line = json.dumps(message).encode() + b"\n"
    first, rest = fds[:FDS_PER_MESSAGE], fds[FDS_PER_MESSAGE:]
    sent = socket.send_fds(sock, [line], first) if first else 0
    sock.sendall(line[sent:])
    for i in range(0, len(rest), FDS_PER_MESSAGE):
        socket.send_fds(sock, [FDS_MORE], rest[i:i + FDS_PER_MESSAGE])


def receive_with_fds(sock: socket.socket, limit: int, count_of: Any) -> tuple[bytes, list[int]]:
    """One line from `sock` and the descriptors that came with it, read with `recvmsg` (never
    through a buffered reader, which would drop them). `count_of(line)` says how many descriptors
    the line announces; more are read until they are all here. b"" at the channel's end."""
    data, fds = bytearray(), []
    while b"\n" not in data:
        chunk, got, _flags, _ = socket.recv_fds(sock, 1 << 16, FDS_PER_MESSAGE + 3)
        fds += got
        if not chunk:
            return b"", _closed(fds)
        data += chunk
        if len(data) > limit:
            raise ValueError(f"a request over {limit} bytes")
    line = bytes(data).split(b"\n", 1)[0]
    wanted = count_of(line)
    while len(fds) < wanted:
        chunk, got, _flags, _ = socket.recv_fds(sock, 1, FDS_PER_MESSAGE + 3)
        if not chunk:
            break
        fds += got
    return line + b"\n", fds


def _closed(fds: list[int]) -> list[int]:
    for fd in fds:
        os.close(fd)
    return []


class Job(Frozen):
    """What both roles' children are told. `indices[k]` is the attempt's index of `workloads[k]`.
    The evaluator fills `result_path` and the channel's descriptor (`clock_fd` where the outer clock
    is on, `checker_fd` where the reference becomes the checker) once the child is started."""
    definition: Definition
    device: str
    correctness_rounds: int
    timing_sets: int
    timed_bytes: int
    regenerate_inputs: bool
    warmup_runs: int
    timing_runs: int
    timing_budget_s: float
    inputs_dir: str
    workloads: list[Workload]
    indices: list[int]
    result_path: str = ""
    clock_fd: int | None = None
    checker_fd: int | None = None


class ReferenceJob(Job):
    """The trusted reference: `seed` is the attempt's secret every input set's seed is hashed from."""
    role: Literal["reference"] = "reference"
    seed: int
    checker: bool = True  # its process stays on as the attempt's checker
    timed_dir: str | None = None  # where its timed sets' files go until the outer clock hands them over
    measure_compile: bool = False
    problem_root: str | None = None


class CandidateJob(Job):
    """The untrusted candidate. Per workload k: `timed_sets[k]` timed sets; `set_seeds[k]` and
    `set_digests[k]` the seeds and digests of the sets it makes again (the timed ones' arrive with
    the outer clock's `go`), or None where its sets are files in `inputs_dir`."""
    role: Literal["candidate"] = "candidate"
    outputs_dir: str
    solution_dir: str
    entry_file: str
    entry_symbol: str
    tunables: dict[str, Any]
    language: str
    gpu_handover: bool
    artifact_path: str | None = None  # what the language's build made (`languages.Built`)
    destination_passing_style: bool
    timed_sets: list[int]
    set_seeds: list[list[int] | None]
    set_digests: list[list[Any] | None]
    # Language `cuda` (services/evaluator/timer/): "record" runs the solution's launch.py against a
    # recording `kernels` and reports each workload's two launch plans ("plans"), timing nothing;
    # `replay` (workload UUID -> plan) makes the child a timer that replays them and imports none of
    # the solution's Python.
    mode: Literal["time", "record"] = "time"
    replay: dict[str, Any] | None = None


AnyJob = Annotated[ReferenceJob | CandidateJob, Field(discriminator="role")]
_JOB = TypeAdapter(AnyJob)


def read_job(text: str | bytes) -> ReferenceJob | CandidateJob:
    return _JOB.validate_json(text)


class WorkloadResult(Frozen):
    """One workload as a child reported it. `status` is "OK" (the candidate ran and timed it; the
    reference made and ran its sets) or the verdict the child reached itself (REWARD_HACK,
    RUNTIME_ERROR, COMPILE_ERROR, INVALID_REFERENCE, NOT_REPRODUCED, ...). The evaluator owns every
    final verdict; the reference's role-specific figures (its sets' seeds and digests, timed sets,
    compile times) ride along as extra fields."""
    model_config = {**Frozen.model_config, "extra": "allow"}

    uuid: str | None = None
    status: str
    message: str = ""
    latency: dict[str, Any] | None = None

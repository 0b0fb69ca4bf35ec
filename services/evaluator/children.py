"""One role's child of an attempt: its job written, its folders handed over (the candidate's), its
private channel served by the outer clock while it runs, and its results read back and matched
with the workloads it was sent."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.evaluator.config import EvalConfig
from services.evaluator.harness.checks import checked_sets
from services.evaluator.harness.correctness import Check
from services.evaluator.outer_clock import OuterClock, Window
from services.evaluator.protocol import (
    MAX_CHECK_REPLY, MAX_SETS_REPLY, CandidateJob, ReferenceJob, WorkloadResult, send, send_with_fds,
)
from services.evaluator.retime import ClockAccount, account
from services.evaluator.sandbox.isolation import StartedChild, finish_child, unprivileged_ids
from shared.errors import EvaluatorFault

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChildResults:
    workloads: list[dict[str, Any]]
    timed_out: bool
    exit_code: int | None
    log: str
    timeout_s: float
    stalled: bool = False
    phases: dict[str, float] = field(default_factory=dict)  # the child's own account (diagnostics only)
    clock: OuterClock | None = None  # what the outer clock saw, where it was on
    checker: Checker | None = None  # the reference's process, still running, where it became the checker
    memory_exceeded_bytes: int | None = None  # killed by its cgroup's OOM killer at this host-memory bound

    def clock_account(self, reference: ChildResults, uuid: str, result: dict[str, Any], timed_sets: int,
                      slack_ms: float, load_avg: tuple[float, float, float] | None = None) -> ClockAccount | str | None:
        """The outer clock's account of a workload the candidate reports as timed (`retime.account`):
        what it is charged and the trace's figures; text where its result is forged (REWARD_HACK);
        None where the outer clock is off."""
        if self.clock is None:
            return None
        ours = reference.clock.windows.get(uuid) if reference.clock is not None else None
        if ours is None or ours.end_s is None:
            raise RuntimeError(f"the reference's timed batch of workload {uuid} was not seen on the outer clock")
        return account(result.get("latency", {}), self.clock.batches.get(uuid, []), ours, timed_sets, slack_ms,
                       load_avg, self.clock.windows.get(uuid))

    def results(self, uuids: list[str], who: str) -> list[dict[str, Any]]:
        """One result per workload sent, matched by UUID; those the child never reached get TIMEOUT
        or RUNTIME_ERROR. Results that do not match what was sent mean the channel was forged."""
        done = list(self.workloads)
        if self.clock is not None and self.clock.violation:
            return [{"status": "REWARD_HACK", "message": f"{who} broke the evaluator's private channel: "
                                                         f"{self.clock.violation}"}] * len(uuids)
        if len(done) > len(uuids) or any(r.get("uuid") != u for r, u in zip(done, uuids)):
            forged = {"status": "REWARD_HACK", "message": f"{who} reported results that do not match the "
                                                          f"workloads sent (a forged result channel)"}
            return [forged] * len(uuids)
        if self.timed_out and self.stalled:
            missing = {"status": "TIMEOUT", "message": f"{who} spent more than {self.timeout_s:.0f} s on one "
                                                      f"workload and was killed"}
        elif self.timed_out:
            missing = {"status": "TIMEOUT", "message": f"{who} ran past {self.timeout_s:.0f} s and was killed"}
        elif self.memory_exceeded_bytes:
            missing = {"status": "RUNTIME_ERROR", "message": f"{who} went over its host-memory bound of "
                                                            f"{self.memory_exceeded_bytes / 2**30:.1f} GiB and "
                                                            f"was killed by the kernel:\n{self.log}"}
        else:
            missing = {"status": "RUNTIME_ERROR",
                       "message": f"{who} exited with code {self.exit_code} before finishing:\n{self.log}"}
        if len(done) == len(uuids):
            return done
        later = {"status": missing["status"], "message": f"not reached: {missing['message']}"}
        return done + [missing] + [later] * (len(uuids) - len(done) - 1)


def run_child(home: Path, config: EvalConfig, start: Callable[[], StartedChild], job: ReferenceJob | CandidateJob,
              hand_over: Callable[[str], dict[str, Any]] = lambda uuid: {},
              seal: Callable[[str, int], None] | None = None,
              retime: Callable[[str, Window], dict[str, Any] | None] | None = None) -> ChildResults:
    """Runs one role's job. The candidate's folders are handed over before its child starts: a
    child forked at once would otherwise enter its home while it is still the evaluator's. The
    outer clock, where on, serves its channel meanwhile (`hand_over(uuid)` at each `ready`,
    `seal(uuid, runs)` at each `end`, then `retime(uuid, window)`: `retime.Retimer`). A reference job with `checker` set returns once the
    reference said `checking`, its process left running as the attempt's checker (`checker`)."""
    result_path = home / "result.json"
    untrusted = isinstance(job, CandidateJob)
    checks = not untrusted and job.checker  # the reference's process stays on as the checker
    if untrusted:
        hand_over_folders(home, Path(job.inputs_dir), Path(job.outputs_dir))
    child = start()
    clock = OuterClock(child.channel, [w.uuid for w in job.workloads], hand_over, seal, checker=checks,
                       retime=retime) if config.outer_clock or checks else None
    job = job.model_copy(update={"result_path": str(result_path),
                                 "clock_fd": child.channel_fd if config.outer_clock else None,
                                 "checker_fd": child.channel_fd if checks else None})
    job_path = home / "job.json"
    job_path.write_text(job.model_dump_json())  # read by the child only once its stdin gives the path
    # The reference has its own limit (a setting, its torch.compile baseline included); both roles
    # are stopped when one workload makes no progress for `workload_timeout_s`.
    timeout_s = config.attempt_timeout_s if untrusted else config.reference_timeout_s
    stall_s = config.workload_timeout_s
    if clock is not None:
        clock.start()
    checker = None
    try:
        run = finish_child(child, str(job_path), timeout_s, result_path, stall_s,
                           until=clock.checking if checks else None)
    finally:
        if clock is not None and checks and clock.checking.is_set() and child.alive():
            clock.join()  # its thread has returned at `checking`: the channel is the checker's now
            checker = Checker(child, timeout_s, job.correctness_rounds)
        elif clock is not None:
            clock.stop()
        else:
            child.channel.close()
    phases: dict[str, float] = {}
    try:
        reported = json.loads(result_path.read_text()) if result_path.exists() else {"workloads": []}
        workloads = [WorkloadResult.model_validate(w).model_dump(exclude_none=True) for w in reported["workloads"]]
        phases = {str(k): float(v) for k, v in reported.get("phases", {}).items()}
    except (ValueError, KeyError, TypeError, AttributeError):  # a ValidationError is a ValueError
        workloads = [{"uuid": None}]  # a result file that is not ours: counted as forged below
    if run.exit_code not in (0, None) or run.timed_out:
        log.info("child %s exited %s timed_out=%s stalled=%s", job.role, run.exit_code, run.timed_out,
                 run.stalled)
    return ChildResults(workloads, run.timed_out, run.exit_code, run.log, stall_s if run.stalled else timeout_s,
                         run.stalled, phases, clock if config.outer_clock else None, checker, run.memory_exceeded_bytes)


def hand_over_folders(home: Path, inputs: Path, outputs: Path) -> None:
    """When the candidate runs as an unprivileged user: its home and output folder become its own,
    the inputs readable, the attempt folder traversable but not listable. Nothing else is shared
    (the timed sets' folder stays the evaluator's, 0700, until its files move: `timed_hand_over`)."""
    ids = unprivileged_ids()
    if ids is None:
        return
    home.parent.chmod(0o711)
    inputs.chmod(0o755)
    for path in inputs.iterdir():
        path.chmod(0o644)
    for folder in (home, outputs):
        for path in (folder, *folder.rglob("*")):
            os.chown(path, *ids)


def open_sets(outputs_dir: Path, index: int, sets: list[int]) -> dict[int, int]:
    """Set number -> a descriptor of the candidate's output file of workload `index` for that set,
    for each that is there: opened by the evaluator, which may read the candidate's folder, for the
    checker, which may not (`send_with_fds`). Never a link followed, never a wait on a FIFO; what
    the descriptor names is checked in the checker (`checks.read_regular`)."""
    found: dict[int, int] = {}
    for s in sets:
        try:
            found[s] = os.open(outputs_dir / f"w{index}_s{s}.st", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                               | os.O_CLOEXEC)
        except OSError:
            continue  # not there (or a link): the checker finds it missing
    return found


class Checker:
    """The evaluator's handle on the reference's process once it said `checking`."""

    def __init__(self, child: StartedChild, timeout_s: float, rounds: int = 0) -> None:
        self.child, self.rounds = child, rounds
        child.channel.settimeout(timeout_s)
        self._reader = child.channel.makefile("rb")
        self._lost: str | None = None  # once a reply is missing or out of turn, no later one is trusted
        self.seconds = {"check": 0.0, "more": 0.0}  # waited for its replies (diagnostics: the turnaround bench)

    def check(self, index: int, runs: int, outputs_dir: Path, shared: dict | None = None,
              first: int | None = None) -> Check:
        """Workload `index`'s correctness rounds and first `runs` timed runs, as they are now: from
        their files, or from the candidate's GPU memory for the sets in `shared` (`gpu_handover`).
        With `first` (a re-timed batch, `retime`): the `runs` sets from set `first` only. A checker
        that does not answer is the evaluator's fault, never a verdict: `EvaluatorFault`."""
        if self._lost is None:
            began = time.perf_counter()
            in_gpu = {int(s) for s in (shared or {})}
            files = open_sets(outputs_dir, index,
                              [s for s in checked_sets(self.rounds, runs, first) if s not in in_gpu])
            try:
                send_with_fds(self.child.channel, {"op": "check", "index": index, "runs": runs, "first": first,
                                                   "files": list(files), "shared": shared}, list(files.values()))
                line = self._reader.readline(MAX_CHECK_REPLY)
                reply = json.loads(line) if line else None
            except (OSError, ValueError) as error:
                reply, line = None, str(error).encode()
            finally:
                for fd in files.values():
                    os.close(fd)
            self.seconds["check"] += time.perf_counter() - began
            if isinstance(reply, dict) and "status" in reply and reply.get("index") == index:
                return Check.from_dict(reply)
            self._lost = repr(line[:200])
        raise EvaluatorFault(f"the attempt's checker (the reference's process) stopped answering before it "
                             f"checked these outputs ({self._lost})")

    def more(self, index: int, first: int, count: int) -> dict[str, Any] | None:
        """`count` fresh timed sets of workload `index`, numbered from `first`, made and run through
        the reference in its process (expected outputs held there): what the candidate's `again`
        carries (their seeds and digests; `set_seeds` None: files saved in the timed sets' folder).
        None where the checker could not make them."""
        if self._lost is not None:
            return None
        began = time.perf_counter()
        try:
            send(self.child.channel, {"op": "more", "index": index, "first": first, "count": count})
            line = self._reader.readline(MAX_SETS_REPLY)
            reply = json.loads(line) if line else None
        except (OSError, ValueError) as error:
            reply, line = None, str(error).encode()
        self.seconds["more"] += time.perf_counter() - began
        if not isinstance(reply, dict) or reply.get("index") != index:
            self._lost = repr(line[:200])
            return None
        if "set_seeds" not in reply:  # it said why it could not: the batch it has is charged
            log.info("the checker made no fresh sets for workload %s: %s", index, str(reply.get("error"))[:500])
            return None
        return {"set_seeds": reply["set_seeds"], "set_digests": reply.get("set_digests")}

    def close(self) -> None:
        try:
            send(self.child.channel, {"op": "quit"})
        except OSError:
            pass  # already gone
        self._reader.close()
        self.child.kill()

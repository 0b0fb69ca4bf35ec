"""The child `shared.sol_bounded` counts in: `python -m shared.sol_child`, a JSON request on stdin.

It runs confined (its `CountRunner`, the evaluator's sandbox): the references it loads are
untrusted text. It limits its own address space (`RLIMIT_AS`, the request's `memory_mb`) before it
imports torch, then writes one JSON line per job (a workload of one of the request's problems) on
the descriptor `results_fd` of the request (the runner's channel; stdout where none is named):
`{"work": ...}` or `{"error": ..., "reason": "memory" | "time" | "count"}`, after a first
`{"ready": true}`. The reference's own prints go to stderr. Each workload has a soft alarm of the
request's `time_s`; the parent kills this process when a workload outlasts that by its grace.
"""

from __future__ import annotations

import os
import resource
import signal
import sys
from pathlib import Path

_MEMORY_MESSAGES = ("can't allocate memory", "not enough memory", "out of memory", "bad_alloc",
                    "cannot allocate memory")


class _TimeLimit(BaseException):  # not an Exception: a reference's `except Exception` does not catch it
    pass


def _limit_memory(memory_mb: int) -> None:
    if memory_mb > 0:
        limit = memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _out_of_memory(error: BaseException) -> bool:
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, MemoryError) or any(m in str(error).lower() for m in _MEMORY_MESSAGES):
            return True
        error = error.__cause__ or error.__context__
    return False


def _peak_mb() -> int | None:
    """VmPeak: the most address space this process has held (what RLIMIT_AS bounds)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmPeak:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return None


def main() -> int:
    import json

    request = json.loads(sys.stdin.read())
    memory_mb = int(request.get("memory_mb") or 0)
    _limit_memory(memory_mb)
    fd = request.get("results_fd")
    results = os.fdopen(os.dup(1) if fd is None else int(fd), "w", buffering=1)
    os.set_inheritable(results.fileno(), False)  # no program the reference runs gets it
    os.dup2(2, 1)  # the reference's prints go to stderr, not into the results
    sys.stdout = sys.stderr
    from shared.schema import Definition, parse_model
    # torch, and torch._dynamo that the first count's dispatch modes import (seconds on a busy
    # machine), before it says it is ready: the first workload's time limit is the count's alone.
    import torch._dynamo  # noqa: F401

    from shared.sol_count import count_work  # noqa: F401

    definitions = [parse_model(Definition, d, "definition") for d in request["definitions"]]
    roots = [Path(r) if r else None for r in request["roots"]]

    def on_alarm(_signum, _frame):
        raise _TimeLimit

    signal.signal(signal.SIGALRM, on_alarm)
    results.write(json.dumps({"ready": True}) + "\n")
    references: dict[int, object] = {}
    for job in request["jobs"]:
        index = int(job["problem"])
        line = _count_one(definitions[index], job["workload"], roots[index], references, index, request)
        if line.get("reason") == "memory":
            line["error"] = (f"the count needed more than the memory limit of {memory_mb} MiB "
                             f"(sol_count_memory_mb): {line['error']}")
        results.write(json.dumps(line | {"peak_mb": _peak_mb()}) + "\n")
    return 0


def _count_one(definition, workload_json: dict, root: Path | None, references: dict, index: int,
               request: dict) -> dict:
    """One workload's result line (without its peak): the work, or the error and its reason. The
    problem's reference is loaded once (`references`, by problem), under the workload's alarm."""
    from shared.schema import Workload, parse_model
    from shared.sol_bounded import work_to_json
    from shared.sol_count import SolCountError, count_work, load_reference

    time_s = float(request["time_s"])
    signal.setitimer(signal.ITIMER_REAL, time_s)
    try:
        workload = parse_model(Workload, workload_json, "workload")
        if index not in references:
            references[index] = load_reference(definition)
        work = count_work(definition, workload, root, use_formulas=request["use_formulas"],
                          cpu_budget_bytes=request["cpu_budget_bytes"], reference=references[index])
        return {"work": work_to_json(work)}
    except _TimeLimit:
        return {"error": f"counting ran past the time limit of {time_s:g} s (sol_count_time_s)", "reason": "time"}
    except SolCountError as error:
        return {"error": str(error), "reason": "memory" if _out_of_memory(error) else "count"}
    except Exception as error:  # noqa: BLE001 - the reference's own failure (at import, say) is data
        reason = "memory" if _out_of_memory(error) else "count"
        return {"error": f"{type(error).__name__}: {str(error).strip()[:300]}", "reason": reason}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


if __name__ == "__main__":
    sys.exit(main())

"""The child `shared.sol_bounded` counts in: `python -m shared.sol_child`, a JSON request on stdin.

It limits its own address space (`RLIMIT_AS`, from KERNELSWARM_SOL_CHILD_MEMORY_MB) before it
imports torch, then writes one JSON line per workload on the stdout it was given: `{"work": ...}`
or `{"error": ..., "reason": "memory" | "time" | "count"}`, after a first `{"ready": true}`. The
reference's own prints go to stderr. Each workload has a soft alarm of the request's `time_s`;
the parent kills this process when a workload outlasts that by its grace.
"""

from __future__ import annotations

import os
import resource
import signal
import sys

_MEMORY_MESSAGES = ("can't allocate memory", "not enough memory", "out of memory", "bad_alloc",
                    "cannot allocate memory")


class _TimeLimit(BaseException):  # not an Exception: a reference's `except Exception` does not catch it
    pass


def _limit_memory() -> None:
    memory_mb = int(os.environ.get("KERNELSWARM_SOL_CHILD_MEMORY_MB", "0"))
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
    _limit_memory()
    results = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the reference's prints go to stderr, not into the results
    sys.stdout = sys.stderr
    import json
    from pathlib import Path

    from shared.schema import Definition, Workload, parse_model
    from shared.sol_bounded import work_to_json
    from shared.sol_count import SolCountError, count_work, load_reference

    request = json.loads(sys.stdin.read())
    definition = parse_model(Definition, request["definition"], "definition")
    workloads = [parse_model(Workload, w, "workload") for w in request["workloads"]]
    root = Path(request["problem_root"]) if request["problem_root"] else None
    time_s = float(request["time_s"])

    def on_alarm(_signum, _frame):
        raise _TimeLimit

    signal.signal(signal.SIGALRM, on_alarm)
    results.write(json.dumps({"ready": True}) + "\n")
    reference = None
    for workload in workloads:
        signal.setitimer(signal.ITIMER_REAL, time_s)
        try:
            if reference is None:
                reference = load_reference(definition)
            work = count_work(definition, workload, root, use_formulas=request["use_formulas"],
                              cpu_budget_bytes=request["cpu_budget_bytes"], reference=reference)
            line = {"work": work_to_json(work)}
        except _TimeLimit:
            line = {"error": f"counting ran past the time limit of {time_s:g} s (sol_count_time_s)", "reason": "time"}
        except SolCountError as error:
            reason = "memory" if _out_of_memory(error) else "count"
            line = {"error": str(error), "reason": reason}
        except Exception as error:  # noqa: BLE001 - the reference's own failure (at import, say) is data
            reason = "memory" if _out_of_memory(error) else "count"
            line = {"error": f"{type(error).__name__}: {str(error).strip()[:300]}", "reason": reason}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if line.get("reason") == "memory":
            line["error"] = (f"the count needed more than the memory limit of "
                             f"{os.environ.get('KERNELSWARM_SOL_CHILD_MEMORY_MB')} MiB (sol_count_memory_mb): "
                             f"{line['error']}")
        results.write(json.dumps(line | {"peak_mb": _peak_mb()}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

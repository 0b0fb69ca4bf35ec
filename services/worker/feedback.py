"""Compact feedback for a model: the status, then one line per workload (its error, or its latency
against the reference and T_sol). Capped so that a long log never floods the model's context."""

from __future__ import annotations

import json

from shared.schema import Trace

MAX_CHARS = 4000
MAX_DETAIL_CHARS = 600
IN_PROCESS = "not replayed, timed in the solution's own process"  # a `cuda` attempt's log begins so (evaluator/timer)


def feedback_text(status: str, message: str | None, traces: list[Trace]) -> str:
    lines = [f"status: {status}"]
    if status in ("COMPILE_ERROR", "UNSUPPORTED") and traces:  # the same build log for every workload
        lines.append(traces[0].evaluation.log.strip()[:MAX_CHARS - 100])
        return "\n".join(lines)
    for trace in traces:
        evaluation = trace.evaluation
        axes = json.dumps(trace.workload.axes, separators=(",", ":"))
        perf = evaluation.performance
        if perf is not None:
            sol = f"; T_sol {evaluation.sol.t_sol_ms:.4g} ms" if evaluation.sol else ""
            lines.append(f"workload {axes}: PASSED {perf.latency_ms:.4g} ms (reference "
                         f"{perf.reference_latency_ms:.4g} ms, {perf.speedup_factor:.2f}x{sol})")
        else:
            detail = " ".join(evaluation.log.strip().split())[-MAX_DETAIL_CHARS:]
            lines.append(f"workload {axes}: {evaluation.status.value}: {detail}")
    if not traces and message:
        lines.append(message.strip()[-MAX_DETAIL_CHARS:])
    why = next((t.evaluation.log.splitlines()[0] for t in traces if t.evaluation.log.startswith(IN_PROCESS)), None)
    if why:  # said once, and whole: the per-workload lines keep a log's end
        lines.insert(1, f"note: {why[:MAX_DETAIL_CHARS]}")
    text = "\n".join(lines)
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + "\n... (more workloads omitted)"

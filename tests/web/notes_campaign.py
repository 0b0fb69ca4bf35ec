"""A scripted campaign that leaves notes on a problem, as the swarm would: the planner's ticks assign
the RMSNorm problem to one LLM writer at a time; each writer session (the real agent loop of
`services.worker.write.run_assignment`) talks to an OpenAI-compatible endpoint that replays scripted
replies (tests/worker/fake_openai.py): it evaluates a kernel, gets the verdict, writes a `note` on
what it found and submits. The evaluator is a stand-in that gives each attempt a scripted verdict at
once (no kernel runs). At the end the planner's tick task trims the notes to the budget.

For the browser test and the screenshot of the notes on the problem's page."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.planner.campaign import create_campaign
from services.planner.notes import trim_campaign_notes
from services.planner.tick import tick
from services.worker.write import run_assignment
from shared.db import AttemptRow, utcnow
from shared.repository import upsert_problem
from shared.runtime import Runtime
from shared.schema import load_problem
from shared.settings import Settings
from tests.worker.fake_openai import ScriptedEndpoint, tool_call

PROBLEMS = Path(__file__).resolve().parents[2] / "problems"
PROBLEM = "llama31_8b_rmsnorm"
MODEL = "qwen3-coder-480b"
BUDGET_CHARS = 1200  # small, so that the notes of this short campaign are trimmed
HOSTILE = "<script>document.title = 'pwned'</script><img src=x onerror=\"document.title = 'pwned'\">"
SOURCE = "import torch\n\n\ndef run(hidden_states, weight, output):\n    output.copy_(hidden_states)\n"


@dataclass(frozen=True)
class Session:
    """One writer session: the verdict its evaluation gets and the note it leaves."""

    status: str
    sol_score: float | None
    speedup: float | None
    message: str | None
    note: str


SESSIONS = (  # each note's first line is its finding: a shortened entry keeps only that
    Session("COMPILE_ERROR", None, None, "main.py:4: SyntaxError: invalid syntax",
            "A one-expression fused RMSNorm does not compile.\n"
            "The inline `rsqrt` with a walrus is a SyntaxError at line 4; keep the reduction and the scale "
            "as two statements."),
    Session("PASSED", 0.52, 1.04, None,
            "Baseline passes at 1.04x eager: memory-bound, two passes over the input.\n"
            "`x * rsqrt(mean(x^2) + eps) * w` in fp32 passes every workload. The time is two passes over "
            "hidden_states (one to reduce, one to scale), so the next gain is one pass, not fewer FLOPs."),
    Session("PASSED", 0.71, 1.93, None,
            "One pass per row: 1.93x eager, SOL 0.71 (the best so far).\n"
            "The row of 4096 bf16 stays in registers between the reduction and the scale. Accumulate the "
            "sum of squares in fp32: bf16 accumulation breaks (next note).\n\n"
            "| num_tokens | ms |\n|---|---|\n| 128 | 0.011 |\n| 1024 | 0.062 |"),
    Session("INCORRECT_NUMERICAL", None, None, "workload 4: 2.3% of elements outside atol 0.01 + rtol 0.01",
            "bf16 accumulation fails: 2.3% of elements outside tolerance at num_tokens=128.\n"
            "Do not lower the accumulator below fp32 for hidden_size 4096."),
    Session("PASSED", 0.69, 1.88, None,
            "Vectorised 16-byte loads gain nothing over one pass per row (1.88x vs 1.93x).\n"
            "The loads were already coalesced. A writer's HTML in a note stays text: " + HOSTILE),
)


@dataclass(frozen=True)
class Campaign:
    runtime: Runtime
    problem_id: int
    campaign_id: int
    endpoint: ScriptedEndpoint
    trimmed: list[int]

    def close(self) -> None:
        self.endpoint.close()
        self.runtime.db.dispose()


def replies() -> list[dict]:
    """What the model says in each session: evaluate, then note, then submit."""
    said = []
    for n, session in enumerate(SESSIONS):
        said += [tool_call("evaluate", {"language": "pytorch", "files": [{"path": "main.py", "content": SOURCE}]},
                           f"call_{n}_1"),
                 tool_call("note", {"text": session.note}, f"call_{n}_2"),
                 tool_call("submit", {}, f"call_{n}_3")]
    return said


def run_campaign(root: Path) -> Campaign:
    """The campaign, run to its end, on a SQLite DB and a local store under `root`."""
    endpoint = ScriptedEndpoint(replies())
    runtime = Runtime(Settings(home=root, problems_dir=PROBLEMS, attempt_wait_s=5.0, model=MODEL,
                               openai_api_key="sk-test", openai_base_url=endpoint.url, notes_budget_chars=BUDGET_CHARS))
    with runtime.db.session() as session:
        problem_id = upsert_problem(session, load_problem(PROBLEMS / PROBLEM)).id
    campaign_id = create_campaign(runtime.db, "scripted notes campaign", [problem_id], "cpu", writers=1,
                                  attempts_per_assignment=2)
    verdicts = iter(SESSIONS)

    def evaluator(attempt_id: str, device: str) -> None:
        verdict = next(verdicts)
        with runtime.db.session() as session:
            attempt = session.get(AttemptRow, attempt_id)
            attempt.status, attempt.message, attempt.finished_at = verdict.status, verdict.message, utcnow()
            attempt.sol_score, attempt.speedup = verdict.sol_score, verdict.speedup
            attempt.workloads_total = 6
            attempt.workloads_passed = 6 if verdict.status == "PASSED" else 0

    trimmed: list[int] = []
    for _ in SESSIONS:  # the planner's tick task: a tick, then the notes trimmed
        assigned: list[int] = []
        tick(runtime.db, campaign_id, assigned.extend)
        trimmed += trim_campaign_notes(runtime, campaign_id)
        assert len(assigned) == 1, assigned
        run_assignment(runtime, assigned[0], evaluator)
    trimmed += trim_campaign_notes(runtime, campaign_id)
    return Campaign(runtime, problem_id, campaign_id, endpoint, trimmed)

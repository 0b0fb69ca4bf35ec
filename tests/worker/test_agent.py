"""The LLM writer against a small OpenAI-compatible HTTP server that replays scripted replies."""

from __future__ import annotations

import ast
import json
import re

import pytest

from services.evaluator.config import EvalConfig

from services.evaluator.evaluate import evaluate
from services.evaluator.languages.nvcc import build_cubin
from services.worker.agent import (
    PROTOCOL, Budget, Feedback, SessionConfig, Tools, parse_fenced, problem_brief, render_protocol, run_session,
)
from services.worker.feedback import feedback_text
from fake_openai import ScriptedEndpoint, Slow, tool_call
from services.worker.llm import ChatModel
from shared.schema import Solution, load_problem

CORRECT = "import torch\n\ndef run(x, w, y):\n    torch.mul(x, w, out=y)\n"


@pytest.fixture
def problem(tmp_path):
    root = tmp_path / "scale"
    root.mkdir()
    (root / "definition.json").write_text(json.dumps({
        "name": "scale", "axes": {"n": {"type": "var"}},
        "inputs": {"x": {"shape": ["n"], "dtype": "float32"}, "w": {"shape": ["n"], "dtype": "float32"}},
        "outputs": {"y": {"shape": ["n"], "dtype": "float32"}},
        "reference": "import torch\n\ndef run(x, w):\n    return x * w\n"}))
    (root / "workload.jsonl").write_text("".join(json.dumps(
        {"uuid": f"n{n}", "axes": {"n": n}, "inputs": {"x": {"type": "random"}, "w": {"type": "random"}},
         "tolerance": {"max_atol": 1e-6, "max_rtol": 1e-6}}) + "\n" for n in (17, 1000)))
    return load_problem(root, with_seeds=False)


class RecordingEvaluator:
    """Stands in for the evaluate queue: records what the agent sent and answers with a fixed verdict."""

    def __init__(self, status: str = "PASSED") -> None:
        self.status, self.calls = status, []

    def __call__(self, solution: Solution, tokens: int) -> Feedback:
        self.calls.append((solution, tokens))
        return Feedback(self.status, f"status: {self.status}\nworkload {{\"n\":17}}: {self.status}")


def test_tool_calls_evaluate_then_submit(problem):
    endpoint = ScriptedEndpoint([
        tool_call("evaluate", {"language": "pytorch", "entry_point": "main.py::run",
                               "files": [{"path": "main.py", "content": CORRECT}]}),
        tool_call("submit", {}, "call_2"),
    ])
    try:
        evaluator = RecordingEvaluator()
        result = run_session(ChatModel("test-model", endpoint.url, "key"), problem, problem_brief(problem),
                             evaluator, Budget())
    finally:
        endpoint.close()
    assert result.submitted and result.stopped_by == "submit" and endpoint.refusals == []
    assert result.evaluations == 1 and result.turns == 2 and result.tokens == sum(endpoint.usages)
    solution, tokens = evaluator.calls[0]
    assert solution.author == "test-model" and solution.definition == "scale" and tokens == endpoint.usages[0]
    first, second = endpoint.requests
    assert first["stream"] is True and first["stream_options"] == {"include_usage": True}
    assert first["messages"][0]["content"] == render_protocol(True, ("evaluate", "submit")) and "tools" in first
    assert "`submit`" in first["messages"][0]["content"] and "<!--" not in first["messages"][0]["content"]
    assert "def run(x, w)" in first["messages"][1]["content"]  # the brief carries the reference
    tool_answer = second["messages"][-1]
    assert tool_answer["role"] == "tool" and tool_answer["tool_call_id"] == "call_1"
    assert tool_answer["content"].startswith("status: PASSED")


def test_endpoint_without_tools_gets_fenced_files(problem):
    fenced = "language: pytorch\n\n```python main.py\n" + CORRECT + "```\n"
    endpoint = ScriptedEndpoint([{"content": fenced}, {"content": "Done.\nSUBMIT\n"}], refuse_tools=True)
    try:
        evaluator = RecordingEvaluator()
        result = run_session(ChatModel("plain-model", endpoint.url, "key"), problem, "brief", evaluator, Budget())
    finally:
        endpoint.close()
    assert result.submitted and result.evaluations == 1
    solution, _tokens = evaluator.calls[0]
    assert solution.spec.language.value == "pytorch" and solution.sources[0].content == CORRECT
    assert [("tools" in r) for r in endpoint.requests] == [True, False, False]
    assert endpoint.requests[-1]["messages"][-1]["content"].startswith("status: PASSED")
    system = endpoint.requests[1]["messages"][0]["content"]  # no tool is named to a model that has none
    assert system == render_protocol(False) and "takes no tool calls" in system
    assert "`evaluate` tool" not in system and "Call `submit`" not in system and "SUBMIT" in system


def test_budget_of_evaluations_ends_the_session(problem):
    call = tool_call("evaluate", {"language": "pytorch", "files": [{"path": "main.py", "content": CORRECT}]})
    endpoint = ScriptedEndpoint([call] * 5)
    try:
        evaluator = RecordingEvaluator("INCORRECT_NUMERICAL")
        result = run_session(ChatModel("m", endpoint.url, "key"), problem, "brief", evaluator, Budget(evaluations=2))
    finally:
        endpoint.close()
    assert not result.submitted and result.stopped_by == "evaluations"
    assert len(evaluator.calls) == 2


def test_a_malformed_solution_costs_no_attempt_and_names_the_field(problem):
    bad = tool_call("evaluate", {"language": "pytorch", "files": [{"path": "../escape.py", "content": CORRECT}]})
    endpoint = ScriptedEndpoint([bad, tool_call("submit", {}, "call_2")])
    try:
        evaluator = RecordingEvaluator()
        result = run_session(ChatModel("m", endpoint.url, "key"), problem, "brief", evaluator, Budget())
    finally:
        endpoint.close()
    assert evaluator.calls == [] and result.evaluations == 0
    answer = endpoint.requests[1]["messages"][-1]["content"]
    assert "INVALID_SOLUTION" in answer and "$.sources[0].path" in answer


def test_parse_fenced_defaults():
    text = "```cuda kernel.cu\nextern \"C\" __global__ void k() {}\n```\n```python launch.py\ndef run(*, kernels): pass\n```"
    parsed = parse_fenced(text, "cuda")
    assert parsed["language"] == "cuda" and [f["path"] for f in parsed["files"]] == ["kernel.cu", "launch.py"]
    assert parse_fenced("no code here", "cuda") is None


def _protocol_block(language: str, first_line: str) -> str:
    blocks = re.findall(rf"```{language}\n(.*?)```", PROTOCOL, re.DOTALL)
    return next(b for b in blocks if b.startswith(first_line))


def test_protocol_pytorch_example_passes_as_it_says(problem):
    source = _protocol_block("python", "import torch")
    solution = Solution.model_validate({
        "name": "protocol_example", "definition": "scale", "author": "protocol",
        "spec": {"languages": ["pytorch"], "target_hardware": ["LOCAL"], "entry_point": "main.py::run"},
        "sources": [{"path": "main.py", "content": source}]})
    config = EvalConfig(device="cpu", correctness_rounds=2, timing_sets=1, warmup_runs=1, timing_runs=3,
                        timing_budget_s=0.2, attempt_timeout_s=60)
    result = evaluate(problem, solution, config)
    assert result.status.value == "PASSED", result.message
    text = feedback_text(result.status.value, result.message, result.traces)
    assert text.startswith("status: PASSED") and "reference" in text


def test_protocol_cuda_example_builds(tmp_path):
    launch = _protocol_block("python", "def run(x, w, y, *, kernels)")
    kernel = _protocol_block("cuda", "extern")
    solution = Solution.model_validate({
        "name": "protocol_cuda", "definition": "scale", "author": "protocol",
        "spec": {"languages": ["cuda"], "target_hardware": ["H200"], "entry_point": "launch.py::run",
                 "tunables": {"BLOCK": [128, 256]}},
        "sources": [{"path": "launch.py", "content": launch}, {"path": "kernel.cu", "content": kernel}]})
    built = build_cubin(solution, "sm_90a", {"BLOCK": 128}, tmp_path / "build")
    assert built.ok, built.log
    compile(launch, "launch.py", "exec")


def test_protocol_cute_dsl_example_is_an_entry_the_evaluator_can_load():
    source = next(b for b in re.findall(r"```python\n(.*?)```", PROTOCOL, re.DOTALL) if "@cute.jit" in b)
    tree = compile(source, "kernel.py", "exec", flags=ast.PyCF_ONLY_AST)
    jitted = [f.name for f in tree.body if isinstance(f, ast.FunctionDef)
              and any(getattr(d, "attr", None) == "jit" for d in f.decorator_list)]
    assert jitted == ["run"]  # compiled on the GPU by tests/gpu/test_cute_dsl.py, on the CPU by hand


# --- context, tools, tokens and the brief against the strict server ---------------------------------

def _big_call(number: int, chars: int = 9000) -> dict:
    source = CORRECT + "".join(f"# line {number}-{i}: padding that stands for a long kernel\n"
                               for i in range(chars // 50))
    return tool_call("evaluate", {"language": "pytorch", "files": [{"path": "main.py", "content": source}]},
                     f"call_{number}")


class VerboseEvaluator(RecordingEvaluator):
    """Feedback as long as a real one with a dozen workloads."""

    def __call__(self, solution: Solution, tokens: int) -> Feedback:
        self.calls.append((solution, tokens))
        lines = [f"workload {{\"n\":{n}}}: PASSED 0.0123 ms (reference 0.0150 ms, 1.22x; T_sol 0.0070 ms)"
                 for n in range(16)]
        return Feedback("PASSED", "status: PASSED\n" + "\n".join(lines))


def test_a_16_turn_session_fits_a_32k_context_and_never_gets_a_context_error(problem):
    replies = [_big_call(n) for n in range(1, 17)]
    endpoint = ScriptedEndpoint(replies, context_tokens=32768)
    try:
        result = run_session(ChatModel("m", endpoint.url, "key"), problem, problem_brief(problem), VerboseEvaluator(),
                             Budget(turns=16, evaluations=16), SessionConfig(context_tokens=32768))
    finally:
        endpoint.close()
    whole = sum(len(json.dumps(r["tool_calls"])) for r in replies) // 4
    assert whole > 32768  # untrimmed, the history alone would not fit
    assert endpoint.refusals == [] and len(endpoint.requests) == 16 and result.stopped_by == "turns"
    last = endpoint.requests[-1]["messages"]
    assert last[0]["content"] == render_protocol(True, ("evaluate", "submit"))
    assert "## Earlier turns" in last[1]["content"] and "def run(x, w)" in last[1]["content"]
    assert "- turn 1: evaluate(pytorch, main.py" in last[1]["content"] and "status: PASSED" in last[1]["content"]
    assert last[-1]["role"] == "tool" and last[-1]["tool_call_id"] == "call_15"


def test_a_context_error_trims_the_history_and_asks_again_with_tools_still_on(problem):
    """The setting says 32K, the model has 9K: the endpoint's refusal names the limit."""
    endpoint = ScriptedEndpoint([_big_call(n, 6000) for n in range(1, 7)], context_tokens=9000)
    try:
        result = run_session(ChatModel("m", endpoint.url, "key"), problem, "brief", RecordingEvaluator(),
                             Budget(turns=6, evaluations=6), SessionConfig(context_tokens=32768, reply_tokens=500))
    finally:
        endpoint.close()
    assert result.turns == 6 and result.evaluations == 6
    assert [status for status, _ in endpoint.refusals] == [400]
    assert endpoint.refusals[0][1]["error"]["code"] == "context_length_exceeded"
    assert all("tools" in r for r in endpoint.requests)


def test_every_turns_tokens_are_counted_once(problem):
    endpoint = ScriptedEndpoint([
        {"content": "Let me think about the shapes first."},
        tool_call("evaluate", {"language": "pytorch", "files": [{"path": "main.py", "content": CORRECT}]}),
        tool_call("submit", {}, "call_2"),
    ])
    recorded = []
    try:
        evaluator = RecordingEvaluator()
        result = run_session(ChatModel("m", endpoint.url, "key"), problem, "brief", evaluator, Budget(),
                             record_tokens=recorded.append)
    finally:
        endpoint.close()
    first, thinking_then_call, closing = endpoint.usages[0], endpoint.usages[1], endpoint.usages[2]
    assert evaluator.calls[0][1] == first + thinking_then_call  # the turns before the attempt go with it
    assert recorded == [closing] and result.tokens == sum(endpoint.usages)


def test_only_the_tools_given_are_offered_and_diagnostics_spend_the_evaluation_budget(problem):
    solution = {"language": "pytorch", "files": [{"path": "main.py", "content": CORRECT}]}
    endpoint = ScriptedEndpoint([
        tool_call("profile", {**solution, "workload": 2}, "call_1"),
        tool_call("inspect", solution, "call_2"),  # not offered
        tool_call("note", {"text": "torch.mul is memory bound here"}, "call_3"),
        tool_call("note", {"text": "a second note"}, "call_4"),
        tool_call("evaluate", solution, "call_5"),
    ])
    profiled, noted = [], []

    def profile(solution: Solution, workload_uuid: str, tokens: int) -> str:
        profiled.append((solution.definition, workload_uuid, tokens))
        return "profile: 1 kernel, 92% of DRAM bandwidth"

    def note(text: str) -> str:
        noted.append(text)
        return "noted (1 entries, 30 chars)"

    try:
        evaluator = RecordingEvaluator()
        tools = Tools(evaluator, profile=profile, note=note)
        result = run_session(ChatModel("m", endpoint.url, "key"), problem, "brief", tools,
                             Budget(evaluations=2, notes=1))
    finally:
        endpoint.close()
    names = [t["function"]["name"] for t in endpoint.requests[0]["tools"]]
    assert names == ["evaluate", "profile", "note", "submit"] and endpoint.refusals == []
    assert profiled == [("scale", "n1000", endpoint.usages[0])]  # workload 2 of the list
    answers = [r["messages"][-1]["content"] for r in endpoint.requests[1:]]
    assert answers[0].startswith("profile: 1 kernel") and answers[1] == "unknown tool 'inspect'"
    assert answers[2].startswith("noted") and answers[3].startswith("note refused: at most 1")
    assert noted == ["torch.mul is memory bound here"]
    assert len(evaluator.calls) == 1 and result.stopped_by == "evaluations"  # profile + evaluate: 2


def test_the_brief_numbers_the_workloads_with_their_figures_and_shows_the_best_as_files(problem):
    best = Solution.model_validate({
        "name": "best", "definition": "scale", "author": "a",
        "spec": {"languages": ["pytorch"], "target_hardware": ["LOCAL"], "entry_point": "main.py::run",
                 "tunables": {"BLOCK": [128, 256]}},
        "sources": [{"path": "main.py", "content": CORRECT}]})
    figures = {"n17": {"reference": 0.015, "T_b": 0.012, "T_sol": 0.007}}
    brief = problem_brief(problem, figures, (best, "status: PASSED"), notes="## A note\nuse float4")
    assert '1. {"n": 17}: reference 0.015 ms, T_b 0.012 ms, T_sol 0.007 ms' in brief
    assert '2. {"n": 1000}' in brief and "```python main.py\n" + CORRECT + "```" in brief
    assert "\\n" not in brief and "use float4" in brief
    parsed = parse_fenced(brief.split("## Current best solution")[1], "cuda")
    assert parsed["files"] == [{"path": "main.py", "content": CORRECT}] and parsed["language"] == "pytorch"
    assert parsed["tunables"] == {"BLOCK": [128, 256]} and parsed["entry_point"] == "main.py::run"


def test_a_turn_the_endpoint_could_not_answer_is_asked_again_in_the_same_conversation(problem):
    evaluate = tool_call("evaluate", {"language": "pytorch", "files": [{"path": "main.py", "content": CORRECT}]})
    endpoint = ScriptedEndpoint([evaluate, Slow(tool_call("submit", {}, "call_2"), 1.0), tool_call("submit", {}, "c3")])
    try:
        model = ChatModel("m", endpoint.url, "key", read_timeout_s=0.3, max_retries=0)
        result = run_session(model, problem, "brief", RecordingEvaluator(), Budget(),
                             SessionConfig(retry_wait_s=0.0))
    finally:
        endpoint.close()
    assert result.submitted and result.turns == 2 and len(endpoint.requests) == 3
    assert endpoint.requests[1]["messages"] == endpoint.requests[2]["messages"]  # nothing of it lost


def test_the_protocol_describes_each_diagnostic_tool_only_where_it_is_offered():
    from services.worker.llm import tool_schemas

    plain = render_protocol(True, ("evaluate", "submit"))
    everything = render_protocol(True, ("evaluate", "profile", "inspect", "note", "submit"))
    fenced = render_protocol(False, ("profile", "inspect", "note"))
    for heading in ("## Looking at the machine code: `inspect`", "## Profiling: `profile`",
                    "## Notes for the writers after you: `note`"):
        assert heading in everything and heading not in plain and heading not in fenced
    assert "<!--" not in everything and "<!--" not in fenced
    arguments = {s["function"]["name"]: set(s["function"]["parameters"]["properties"])
                 for s in tool_schemas(("profile", "inspect", "note"))}
    assert "workload" in arguments["profile"] and "`workload`" in everything  # the names the schemas take
    assert "kernel" in arguments["inspect"] and "`kernel`" in everything
    assert arguments["note"] == {"text"} and "`text`" in everything

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
    PROTOCOL, Budget, Feedback, parse_fenced, problem_brief, render_protocol, run_session,
)
from services.worker.feedback import feedback_text
from fake_openai import ScriptedEndpoint, tool_call
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

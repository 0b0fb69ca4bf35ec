"""`ChatModel` against the strict scripted server: schemas, streaming, and what each error means."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
from fake_openai import RATE_LIMITED, RequestRefused, ScriptedEndpoint, Slow, check_tools, openai_error, tool_call
from services.worker.llm import ChatModel, ContextTooLong, ToolsRefused, _assemble, tool_schemas
from shared.errors import EndpointError, EndpointUnavailable

ALL = ("evaluate", "profile", "inspect", "note", "submit")
MESSAGES = [{"role": "system", "content": "protocol"}, {"role": "user", "content": "brief"}]


def ask(endpoint: ScriptedEndpoint, tools=("evaluate", "submit"), **kwargs):
    model = ChatModel(kwargs.pop("model", "m"), endpoint.url, kwargs.pop("key", "key"), **kwargs)
    return model, model.complete(MESSAGES, tools)


def test_every_tool_schema_passes_the_hosted_apis_check_and_the_old_one_would_not():
    schemas = tool_schemas(ALL)
    assert [s["function"]["name"] for s in schemas] == list(ALL)
    check_tools(schemas)
    old = copy.deepcopy(schemas[0])
    old["function"]["parameters"]["properties"]["tunables"]["additionalProperties"] = {"type": "array"}
    with pytest.raises(RequestRefused, match="array schema missing items"):
        check_tools([old])
    some = tool_schemas(("evaluate", "note", "submit"))
    assert [s["function"]["name"] for s in some] == ["evaluate", "note", "submit"]


def test_a_streamed_reply_is_put_together_from_its_deltas():
    arguments = {"language": "pytorch", "files": [{"path": "main.py", "content": "x" * 200}]}
    endpoint = ScriptedEndpoint([{**tool_call("evaluate", arguments), "content": "Trying a first kernel."}])
    try:
        model, reply = ask(endpoint)
    finally:
        endpoint.close()
    request = endpoint.requests[0]
    assert request["stream"] is True and request["stream_options"] == {"include_usage": True}
    assert reply.text == "Trying a first kernel." and reply.tool_calls[0].arguments == arguments
    assert reply.tool_calls[0].id == "call_1" and reply.tokens == endpoint.usages[0] and reply.prompt_tokens > 0
    assert reply.raw["tool_calls"][0]["function"]["name"] == "evaluate" and endpoint.refusals == []


def test_an_endpoint_that_refuses_streaming_gets_whole_replies_from_then_on():
    endpoint = ScriptedEndpoint([{"content": "one"}, {"content": "two"}], refuse_stream=True)
    try:
        model, reply = ask(endpoint)
        second = model.complete(MESSAGES, ("evaluate", "submit"))
    finally:
        endpoint.close()
    assert (reply.text, second.text) == ("one", "two") and not model.streaming and model.tools_supported
    assert [r.get("stream", False) for r in endpoint.requests] == [True, False, False]
    assert reply.tokens == endpoint.usages[0]


def test_an_endpoint_that_ignores_stream_and_sends_json_is_asked_again_without_it():
    """A 200 with a whole JSON reply to `stream: true` holds no server-sent event: read as nothing,
    every turn would be empty (16 turns of "no solution found"); asked again, without streaming."""
    endpoint = ScriptedEndpoint([{"content": "lost"}, {"content": "one"}, {"content": "two"}], ignore_stream=True)
    try:
        model, reply = ask(endpoint)
        second = model.complete(MESSAGES, ("evaluate", "submit"))
    finally:
        endpoint.close()
    assert (reply.text, second.text) == ("one", "two") and not model.streaming
    assert [r.get("stream", False) for r in endpoint.requests] == [True, False, False]


def test_only_a_refusal_of_tools_turns_tools_off():
    endpoint = ScriptedEndpoint([], refuse_tools=True)
    try:
        model = ChatModel("m", endpoint.url, "key")
        with pytest.raises(ToolsRefused):
            model.complete(MESSAGES, ("evaluate", "submit"))
    finally:
        endpoint.close()
    assert not model.tools_supported
    other = ScriptedEndpoint([openai_error(400, "Invalid value for 'temperature'", None, param="temperature")])
    try:
        model = ChatModel("m", other.url, "key")
        with pytest.raises(EndpointError) as refused:
            model.complete(MESSAGES, ("evaluate", "submit"))
    finally:
        other.close()
    assert refused.value.kind == "request" and model.tools_supported


def test_a_context_error_is_told_apart_with_its_limit_and_leaves_tools_on():
    endpoint = ScriptedEndpoint([{"content": "never"}], context_tokens=50)
    try:
        model = ChatModel("m", endpoint.url, "key")
        with pytest.raises(ContextTooLong) as refused:
            model.complete(MESSAGES, ("evaluate", "submit"))
    finally:
        endpoint.close()
    assert refused.value.limit_tokens == 50 and model.tools_supported
    assert endpoint.refusals[0][1]["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize(("settings", "kind", "hint"), [
    ({"key": "sk-wrong"}, "auth", "OPENAI_API_KEY"),
    ({"model": "gpt-nope"}, "model", "KERNELSWARM_MODEL"),
], ids=["wrong-key", "unknown-model"])
def test_a_wrong_key_or_model_is_a_fatal_endpoint_error_asked_once(settings, kind, hint):
    endpoint = ScriptedEndpoint([{"content": "never"}], models={"m"}, api_keys={"key"})
    try:
        with pytest.raises(EndpointError) as refused:
            ask(endpoint, **settings)
    finally:
        endpoint.close()
    assert refused.value.kind == kind and hint in str(refused.value) and endpoint.url in str(refused.value)
    assert len(endpoint.requests) == 1  # not retried


def test_a_rate_limit_is_retryable_and_no_quota_is_fatal():
    endpoint = ScriptedEndpoint([RATE_LIMITED, {"content": "after the wait"}])
    try:
        _model, reply = ask(endpoint)  # the client's own retry, after the server's retry-after-ms
    finally:
        endpoint.close()
    assert reply.text == "after the wait" and [s for s, _ in endpoint.refusals] == [429]
    endpoint = ScriptedEndpoint([RATE_LIMITED])
    try:
        with pytest.raises(EndpointUnavailable) as busy:
            ask(endpoint, max_retries=0)
    finally:
        endpoint.close()
    assert busy.value.kind == "rate_limit"
    endpoint = ScriptedEndpoint([openai_error(429, "You exceeded your current quota, please check your plan.",
                                              "insufficient_quota", kind="insufficient_quota")])
    try:
        with pytest.raises(EndpointError) as broke:
            ask(endpoint, max_retries=0)
    finally:
        endpoint.close()
    assert broke.value.kind == "quota"


def test_a_slow_streamed_turn_runs_past_the_turn_timeout_while_chunks_keep_coming():
    """20-odd chunks 0.15 s apart: about 3 s in all, over the 1 s turn timeout, each gap far under
    the 1.5 s read timeout. A reply silent past the read timeout is a retryable timeout."""
    endpoint = ScriptedEndpoint([Slow({"content": "y" * 400}, 0.15), Slow({"content": "z"}, 2.0)])
    try:
        model, reply = ask(endpoint, read_timeout_s=1.5, turn_timeout_s=1.0, max_retries=0)
        assert reply.text == "y" * 400
        model._stream_timeout = type(model._stream_timeout)(1.0, connect=5.0, read=0.3)
        with pytest.raises(EndpointUnavailable) as silent:
            model.complete(MESSAGES, ())
    finally:
        endpoint.close()
    assert silent.value.kind == "timeout"


def test_tool_call_deltas_without_an_index_are_put_together_by_id():
    """Some OpenAI-compatible servers leave `index` out of tool-call deltas."""
    def chunk(call_id=None, name=None, arguments=None, usage=None):
        function = SimpleNamespace(name=name, arguments=arguments)
        delta = SimpleNamespace(content=None, tool_calls=[SimpleNamespace(index=None, id=call_id, function=function)])
        return SimpleNamespace(usage=usage, choices=[SimpleNamespace(delta=delta)])

    stream = [chunk("a", "evaluate", '{"language": '), chunk(arguments='"cuda"}'), chunk("b", "submit", "{}"),
              SimpleNamespace(usage=SimpleNamespace(total_tokens=42, prompt_tokens=40), choices=[])]
    reply = _assemble(stream, MESSAGES)
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [("a", "evaluate", {"language": "cuda"}),
                                                                       ("b", "submit", {})]
    assert (reply.tokens, reply.prompt_tokens) == (42, 40)

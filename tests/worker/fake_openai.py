"""A small OpenAI-compatible chat server for tests: replays scripted replies, records requests."""

from __future__ import annotations

import json
import threading

from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response


class ScriptedEndpoint:
    """POST /v1/chat/completions answers with the next scripted message; records every request.
    With `refuse_tools`, a request that offers tools gets a 400, as some servers do."""

    def __init__(self, replies: list[dict], refuse_tools: bool = False) -> None:
        self.replies, self.refuse_tools, self.requests = list(replies), refuse_tools, []
        self.server = make_server("127.0.0.1", 0, self._app)
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @Request.application
    def _app(self, request: Request) -> Response:
        body = json.loads(request.get_data())
        self.requests.append(body)
        if self.refuse_tools and "tools" in body:
            return Response(json.dumps({"error": {"message": "tools are not supported", "type": "invalid_request"}}),
                            status=400, content_type="application/json")
        message = self.replies.pop(0)
        reply = {"id": f"c{len(self.requests)}", "object": "chat.completion", "created": 0, "model": body["model"],
                 "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": "stop"}],
                 "usage": {"prompt_tokens": 100, "completion_tokens": 23, "total_tokens": 123}}
        return Response(json.dumps(reply), content_type="application/json")

    def close(self) -> None:
        self.server.shutdown()


def tool_call(name: str, arguments: dict, call_id: str = "call_1") -> dict:
    return {"content": None, "tool_calls": [{"id": call_id, "type": "function",
                                              "function": {"name": name, "arguments": json.dumps(arguments)}}]}

"""A scripted A2A agent on loopback: answers JSON-RPC ``message/send`` with queued replies.

The A2A protocol (0.3) sends ``{"jsonrpc": "2.0", "method": "message/send", "params":
{"message": {...}}}`` to the agent's URL; the result is a Message (``kind: message`` with
``parts``) or a Task (``kind: task`` with ``artifacts`` and a ``status``). Tests queue results
(or JSON-RPC errors) with :meth:`ScriptedA2AServer.script` and read what was sent in
:attr:`ScriptedA2AServer.requests`. A stdlib threaded server, like the scripted model server.
"""

from __future__ import annotations

import json
from collections import deque
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.support.http_serving import ServedHTTP


def message(text: str) -> dict[str, Any]:
    """A Message result with one text part."""
    return {
        "kind": "message",
        "role": "agent",
        "messageId": "m-1",
        "parts": [{"kind": "text", "text": text}],
    }


def task(text: str, state: str = "completed") -> dict[str, Any]:
    """A Task result whose artifact holds the text."""
    return {
        "kind": "task",
        "id": "t-1",
        "contextId": "c-1",
        "status": {"state": state},
        "artifacts": [{"artifactId": "a-1", "parts": [{"kind": "text", "text": text}]}],
    }


def error(code: int, text: str) -> dict[str, Any]:
    """A JSON-RPC error (queued in place of a result)."""
    return {"error": {"code": code, "message": text}}


class ScriptedA2AServer(ServedHTTP):
    """An A2A agent at :attr:`url` answering each request with the next queued reply."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self._replies: deque[dict[str, Any]] = deque()
        super().__init__(self._handler_class())

    @property
    def url(self) -> str:
        """The agent's URL (JSON-RPC is posted to it)."""
        return f"{self.origin}/"

    def script(self, *replies: dict[str, Any]) -> None:
        """Queue results (or :func:`error` replies), one per request."""
        self._replies.extend(replies)

    def _answer(self, request: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(request)
        reply = self._replies.popleft() if self._replies else error(-32603, "no reply scripted")
        if request.get("method") != "message/send":
            reply = error(-32601, f"method not found: {request.get('method')}")
        body = reply if "error" in reply else {"result": reply}
        return {"jsonrpc": "2.0", "id": request.get("id"), **body}

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                answer = server._answer(json.loads(self.rfile.read(length) or b"{}"))
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler

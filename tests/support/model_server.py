"""A scripted OpenAI-compatible model server on loopback, for tests of the agents layer.

litellm makes real HTTP calls to it (model ``openai/<anything>``, ``api_base`` = :attr:`url`),
so the tests exercise the same request building and response parsing as production. Each test
scripts the replies as a queue::

    server.script(
        Reply.tool_calls(ToolCall("get_weather", {"city": "Oslo"})),
        Reply.text("It is sunny."),
    )

A request with ``stream: true`` is answered with server-sent events as OpenAI sends them
(``data:`` lines of ``chat.completion.chunk``, tool-call arguments in several deltas, the usage
in a last chunk when ``stream_options.include_usage`` is asked, then ``data: [DONE]``);
``Reply(break_after=n)`` drops the connection after ``n`` content chunks, a stream that breaks
mid-way; ``Reply(hold_after=n)`` sends ``n`` content chunks, sets :attr:`ScriptedModelServer.holding`
and sends the rest only once :meth:`ScriptedModelServer.release` is called, so a test can see
what a reader showed while the answer was still being written; ``Reply(gap=s)`` waits ``s``
seconds between content chunks, a model writing slowly. Each streamed request records the
wall-clock time each content chunk left (:attr:`RecordedRequest.pieces_sent`), for latency
figures. Every request body is recorded in :attr:`ScriptedModelServer.requests` so tests can
assert on what the model was sent (system prompt, merged history, tool results). When the queue is empty
the server answers 500 with a message saying so, which fails the test loudly.

The server is a threaded stdlib HTTP server: it runs in its own threads, independent of the
event loop of the test, so a blocked loop cannot deadlock it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler
from typing import Any

from agentflows.agents import secrets
from agentflows.api import agent as agent_api
from agentflows.api import common
from tests.support.http_serving import ServedHTTP

#: The API key the fixture's model spec resolves to; the server records what it receives.
API_KEY = "sk-scripted-test-key-0123456789"
_KEY_REF = common.SecretKeyRef(
    secret_key_ref=common.SecretKeySelector(name="scripted-model", key="api-key")
)


@dataclasses.dataclass
class ToolCall:
    """One tool call in a scripted reply."""

    name: str
    arguments: Any = dataclasses.field(default_factory=dict)
    #: Defaults to call_<n>, unique per server.
    id: str | None = None
    #: Send these exact argument bytes instead of JSON of ``arguments`` (to script bad JSON).
    raw_arguments: str | None = None


@dataclasses.dataclass
class Reply:
    """One scripted response: text, tool calls, or an HTTP error; optionally delayed or held."""

    content: str | None = None
    tool_calls: list[ToolCall] = dataclasses.field(default_factory=list)
    status: int = 200
    error_message: str = ""
    delay: float = 0.0
    prompt_tokens: int = 11
    completion_tokens: int = 7
    #: When streamed: the content in these pieces (default: word by word, spaces kept).
    pieces: list[str] | None = None
    #: When streamed: drop the connection after this many content chunks (no ``[DONE]``).
    break_after: int | None = None
    #: Answer only once this is set (at most 300 s): a test keeps the request in flight, to
    #: kill its caller mid-call.
    hold: threading.Event | None = None
    #: When streamed: after this many content chunks, wait for :meth:`ScriptedModelServer.release`.
    hold_after: int | None = None
    #: When streamed: seconds between two content chunks.
    gap: float = 0.0
    #: Extra response headers of an error reply (``Retry-After``, say).
    headers: dict[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def text(cls, content: str, **kwargs: Any) -> Reply:
        """A final text answer."""
        return cls(content=content, **kwargs)

    @classmethod
    def calls(cls, *calls: ToolCall, **kwargs: Any) -> Reply:
        """An assistant turn asking for one or several tool calls."""
        return cls(tool_calls=list(calls), **kwargs)

    @classmethod
    def error(cls, status: int, message: str = "scripted error", **kwargs: Any) -> Reply:
        """An HTTP error with an OpenAI-style error body."""
        return cls(status=status, error_message=message, **kwargs)


@dataclasses.dataclass
class RecordedRequest:
    """One request the server received."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    #: ``time.monotonic()`` when the request was read (benchmarks time a client's first call).
    received: float = dataclasses.field(default_factory=time.monotonic)
    #: ``time.time()`` when each content chunk of a streamed answer was written to the socket.
    pieces_sent: list[float] = dataclasses.field(default_factory=list)

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The chat messages sent."""
        return list(self.body.get("messages", []))


class ScriptedModelServer(ServedHTTP):
    """An OpenAI-compatible chat-completions server answering from a script."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._replies: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._call_ids = itertools.count(1)
        self.requests: list[RecordedRequest] = []
        #: chat requests being answered now, and the most answered at once (concurrency seen)
        self.in_flight = 0
        self.max_in_flight = 0
        #: Set while a ``hold_after`` reply waits for :meth:`release`.
        self.holding = threading.Event()
        self._released = threading.Event()
        super().__init__(self._handler_class(), host, port, name="scripted-model-server")

    @property
    def url(self) -> str:
        """Base URL to use as ``api_base`` (ends in ``/v1``)."""
        return f"{self.origin}/v1"

    def script(self, *replies: Reply) -> None:
        """Queue replies; each chat-completions request takes the next one."""
        with self._lock:
            self._replies.extend(replies)

    def drop_script(self) -> None:
        """Drop the replies not consumed yet (a benchmark reuses the server across cases)."""
        with self._lock:
            self._replies.clear()

    def release(self) -> None:
        """Let a held streamed answer go on (and any later one pass its hold)."""
        self._released.set()

    @property
    def pending(self) -> int:
        """Scripted replies not consumed yet."""
        with self._lock:
            return len(self._replies)

    def model_spec(self, **overrides: Any) -> agent_api.ModelSpec:
        """A ModelSpec pointing at this server, with an apiKey secret ref (see :attr:`env`)."""
        fields: dict[str, Any] = {
            "name": "openai/scripted-model",
            "api_base": self.url,
            "api_key": _KEY_REF,
            "retries": 0,
            "timeout_seconds": 10,
        }
        fields.update(overrides)
        return agent_api.ModelSpec(**fields)

    @property
    def env(self) -> dict[str, str]:
        """The environment under which :meth:`model_spec`'s apiKey resolves."""
        return {secrets.secret_env_name(_KEY_REF): API_KEY}

    # -- serving ---------------------------------------------------------------------------

    def _next_reply(self) -> Reply | None:
        with self._lock:
            return self._replies.popleft() if self._replies else None

    def _completion(self, request: RecordedRequest) -> tuple[int, dict[str, Any]]:
        reply = self._next_reply()
        if reply is None:
            return 500, _error_body("the scripted model server has no reply left for this request")
        if reply.delay:
            time.sleep(reply.delay)
        if reply.hold is not None:
            reply.hold.wait(300)
        if reply.status != 200:
            return reply.status, {**_error_body(reply.error_message), "_headers": reply.headers}
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id or f"call_{next(self._call_ids)}",
                    "type": "function",
                    "function": {
                        "name": call.name,
                        "arguments": call.raw_arguments
                        if call.raw_arguments is not None
                        else json.dumps(call.arguments),
                    },
                }
                for call in reply.tool_calls
            ]
        body = {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(request.body.get("model", "scripted")),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if reply.tool_calls else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": reply.prompt_tokens,
                "completion_tokens": reply.completion_tokens,
                "total_tokens": reply.prompt_tokens + reply.completion_tokens,
            },
        }
        body["_scripted"] = reply
        return 200, body

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(self, status: int, body: dict[str, Any]) -> None:
                body.pop("_scripted", None)
                extra = body.pop("_headers", None) or {}
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._send(
                        200,
                        {"object": "list", "data": [{"id": "scripted-model", "object": "model"}]},
                    )
                else:
                    self._send(404, _error_body(f"no route {self.path}"))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b"{}"
                try:
                    body = json.loads(raw)
                except ValueError:
                    self._send(400, _error_body("request body is not JSON"))
                    return
                recorded = RecordedRequest(
                    self.path, {k.lower(): v for k, v in self.headers.items()}, body
                )
                with server._lock:
                    server.requests.append(recorded)
                if not self.path.split("?")[0].rstrip("/").endswith("/chat/completions"):
                    self._send(404, _error_body(f"no route {self.path}"))
                    return
                with server._lock:
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    status, reply = server._completion(recorded)
                finally:
                    with server._lock:
                        server.in_flight -= 1
                if status == 200 and body.get("stream"):
                    self._send_stream(reply, recorded)
                else:
                    self._send(status, reply)

            def _send_stream(self, reply: dict[str, Any], request: RecordedRequest) -> None:
                scripted = reply.pop("_scripted")
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                usage = bool((request.body.get("stream_options") or {}).get("include_usage"))
                # the first event carries the role; the content pieces follow it
                text = reply["choices"][0]["message"].get("content") or ""
                content = len(scripted.pieces if scripted.pieces is not None else _words(text))
                for number, event in enumerate(sse_events(reply, scripted, usage)):
                    if event is None:
                        self.wfile.flush()
                        self.close_connection = True
                        return
                    if scripted.hold_after is not None and number == scripted.hold_after + 1:
                        server.holding.set()
                        server._released.wait(timeout=300)
                        server.holding.clear()
                    self.wfile.write(event)
                    self.wfile.flush()
                    if 1 <= number <= content:
                        request.pieces_sent.append(time.time())
                        if scripted.gap and number < content:
                            time.sleep(scripted.gap)

        return Handler


def _error_body(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "scripted_error", "code": None}}


def sse_events(reply: dict[str, Any], scripted: Reply, usage: bool) -> list[bytes | None]:
    """The server-sent events of a streamed ``reply``; ``None`` marks where it breaks off."""
    head = {key: reply[key] for key in ("id", "created", "model")}
    message = reply["choices"][0]["message"]

    def event(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        chunk = {
            **head,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            **extra,
        }
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    events: list[bytes | None] = [event({"role": "assistant", "content": ""})]
    content = message.get("content") or ""
    pieces = scripted.pieces if scripted.pieces is not None else _words(content)
    for number, piece in enumerate(pieces):
        if scripted.break_after is not None and number == scripted.break_after:
            return [*events, None]
        events.append(event({"content": piece}))
    for index, call in enumerate(message.get("tool_calls") or []):
        arguments = call["function"]["arguments"]
        half = len(arguments) // 2
        first = {"index": index, "id": call["id"], "type": "function"}
        first["function"] = {"name": call["function"]["name"], "arguments": arguments[:half]}
        events.append(event({"tool_calls": [first]}))
        rest = {"index": index, "function": {"arguments": arguments[half:]}}
        events.append(event({"tool_calls": [rest]}))
    events.append(event({}, reply["choices"][0]["finish_reason"]))
    if usage:
        events.append(
            b"data: "
            + json.dumps(
                {**head, "object": "chat.completion.chunk", "choices": [], "usage": reply["usage"]}
            ).encode()
            + b"\n\n"
        )
    return [*events, b"data: [DONE]\n\n"]


def _words(content: str) -> list[str]:
    """``content`` in word-sized pieces that join back to it."""
    return [word for word in re.split(r"(?<= )", content) if word]

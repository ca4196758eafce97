"""The direct path to OpenAI-compatible endpoints: one ``POST {apiBase}/chat/completions``.

Called by :func:`agentflows.agents.model.complete` for ``openai/...`` models (and bare model
names, which litellm reads as OpenAI's) and for any model with an ``apiBase`` whose provider
speaks the OpenAI wire format (vLLM, LM Studio, a LiteLLM proxy, ...). It exists because
importing litellm takes seconds, which a runner pod would pay before its first model call;
httpx takes a tenth of that. The request and the reply have the shape litellm would send and
parse; usage comes from the reply's ``usage``, and the cost from
:mod:`agentflows.agents.costs`.

The request goes through the one address guard (:mod:`agentflows.agents.egress`): the
``apiBase`` host, as written, is the only one allowed, it connects to the address it checked,
and a redirect is not followed (a model endpoint has no reason to send one, and a hop would be
one more place for the API key to go).

With a ``stream`` callback the request asks for a stream (``stream: true`` and
``stream_options: {include_usage: true}``, OpenAI's server-sent events): each piece of text is
passed to the callback as it arrives, and the chunks are assembled into the reply an unstreamed
request returns (:func:`assemble`), usage from the last chunk, so what is recorded is the same.
A stream that ends before its ``data: [DONE]`` (the connection dropped mid-way) raises
``httpx.RemoteProtocolError``, a transport error like a dropped request.

Errors are reported as :class:`ModelHttpError` (an HTTP status with the start of the provider's
message, at most :data:`MAX_QUOTED_CHARS`) or the underlying httpx exception;
:mod:`agentflows.agents.model` decides what may be retried.
"""

from __future__ import annotations

import functools
import json
import ssl
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from agentflows.agents import egress
from agentflows.api import errors, retry

#: Where ``openai/...`` models go when the Agent sets no apiBase.
OPENAI_API_BASE = "https://api.openai.com/v1"
#: How much of an endpoint's error reply is quoted (into the node's error, the run's status).
MAX_QUOTED_CHARS = 300
#: What a streamed request adds to the body: the stream, with usage in its last chunk.
STREAM_OPTIONS: dict[str, Any] = {"stream": True, "stream_options": {"include_usage": True}}
#: Providers litellm reaches with a wire format of their own: never the direct path.
NATIVE_WIRE_PROVIDERS = frozenset(
    {
        "anthropic",
        "azure",
        "azure_ai",
        "bedrock",
        "cohere",
        "databricks",
        "gemini",
        "huggingface",
        "ollama",
        "ollama_chat",
        "replicate",
        "sagemaker",
        "vertex_ai",
        "watsonx",
    }
)


class ModelHttpError(errors.AgentflowsError):
    """The endpoint answered with an HTTP error; ``message`` is the provider's explanation."""

    def __init__(self, status_code: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        #: Seconds the endpoint's ``Retry-After`` asked to wait, if it said.
        self.retry_after = retry_after
        #: 408, 425, 429, 5xx, and 409 (a provider's "busy, try again"): the call may pass later.
        self.retryable = retry.status_may_help(status_code, conflict_passes=True)


def handles(provider: str, api_base: str | None) -> bool:
    """Tell whether a model goes the direct path (see module docstring)."""
    return provider == "openai" or (api_base is not None and provider not in NATIVE_WIRE_PROVIDERS)


def wire_model(model_name: str) -> str:
    """The model name sent in the request: the litellm string without its provider prefix."""
    _, slash, rest = model_name.partition("/")
    return rest if slash else model_name


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    # Building the default context loads the CA bundle (tens of ms): once per process.
    return httpx.create_ssl_context()


async def chat_completion(
    *,
    api_base: str | None,
    api_key: str | None,
    body: Mapping[str, Any],
    timeout_seconds: float,
    stream: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """POST one chat completion and return the reply's JSON (streamed to ``stream`` if given)."""
    url = (api_base or OPENAI_API_BASE).rstrip("/") + "/chat/completions"
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    guard = egress.Guard.for_url(url)
    async with egress.async_client(guard, timeout=timeout_seconds, verify=_ssl_context()) as client:
        if stream is not None:
            return await _streamed(client, url, {**body, **STREAM_OPTIONS}, headers, stream)
        response = await client.post(url, json=dict(body), headers=headers)
    return _reply_json(response)


def _reply_json(response: httpx.Response) -> dict[str, Any]:
    """The JSON of an unstreamed reply, or the ModelHttpError it stands for."""
    if response.is_redirect:
        raise ModelHttpError(
            response.status_code,
            "the endpoint answered with a redirect, which is not followed: "
            "set apiBase to the URL that serves /chat/completions",
        )
    try:
        data = response.json()
    except ValueError:
        data = None
    if response.status_code >= 400:
        asked = retry.retry_after(response.headers.get("retry-after"))
        raise ModelHttpError(response.status_code, error_message(data, response.text), asked)
    if not isinstance(data, dict) or not data.get("choices"):
        raise ModelHttpError(502, f"the endpoint's reply has no choices: {quoted(response.text)}")
    return data


async def _streamed(
    client: httpx.AsyncClient,
    url: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    stream: Callable[[str], None],
) -> dict[str, Any]:
    """POST a streamed completion, pass its text on, and return the reply it assembles to."""
    async with client.stream("POST", url, json=dict(body), headers=headers) as response:
        if response.is_redirect or response.status_code >= 400:
            await response.aread()
            return _reply_json(response)
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            # An endpoint that ignores "stream" answers whole: the whole text is one piece.
            await response.aread()
            data = _reply_json(response)
            text = ((data["choices"][0].get("message") or {}).get("content")) or ""
            if text:
                stream(str(text))
            return data
        chunks: list[dict[str, Any]] = []
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue  # blank separators, ": keep-alive" comments, "event:" names
            payload = line[len("data:") :].strip()
            if payload == "[DONE]":
                return assemble(chunks)
            chunk = _chunk(payload)
            chunks.append(chunk)
            for choice in chunk.get("choices") or []:
                text = (choice.get("delta") or {}).get("content")
                if text:
                    stream(str(text))
    raise httpx.RemoteProtocolError("the model's stream ended before its last event ([DONE])")


def _chunk(payload: str) -> dict[str, Any]:
    try:
        chunk = json.loads(payload)
    except ValueError:
        chunk = None
    if not isinstance(chunk, dict):
        raise ModelHttpError(502, f"the stream sent a chunk that is not JSON: {quoted(payload)}")
    if isinstance(chunk.get("error"), dict | str):
        raise ModelHttpError(502, error_message(chunk, payload))
    return chunk


def assemble(chunks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The ``chat.completion`` reply a stream's chunks add up to (OpenAI's stream format)."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish_reason: str | None = None
    reply: dict[str, Any] = {"object": "chat.completion"}
    for chunk in chunks:
        for key in ("id", "created", "model", "system_fingerprint"):
            if chunk.get(key) is not None:
                reply.setdefault(key, chunk[key])
        if chunk.get("usage"):
            reply["usage"] = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            content.append(str(delta.get("content") or ""))
            for part in delta.get("tool_calls") or []:
                _add_call_delta(calls, part)
            finish_reason = choice.get("finish_reason") or finish_reason
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [calls[index] for index in sorted(calls)]
    reply["choices"] = [{"index": 0, "message": message, "finish_reason": finish_reason}]
    # the keys in the order of an unstreamed reply, so the recorded ``raw`` reads the same
    order = ("id", "object", "created", "model", "system_fingerprint", "choices", "usage")
    return {key: reply[key] for key in order if key in reply}


def _add_call_delta(calls: dict[int, dict[str, Any]], part: Mapping[str, Any]) -> None:
    """Fold one tool-call delta in: the first names the call, the rest add argument text."""
    index = int(part.get("index") or 0)
    call = calls.setdefault(
        index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
    )
    if part.get("id"):
        call["id"] = part["id"]
    function = part.get("function") or {}
    call["function"]["name"] += str(function.get("name") or "")
    call["function"]["arguments"] += str(function.get("arguments") or "")


def request_body(
    model_name: str,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]],
    options: Mapping[str, Any],
) -> dict[str, Any]:
    """The request body: model, messages, tools and the sampling options that are set."""
    body: dict[str, Any] = {
        "model": wire_model(model_name),
        "messages": [dict(message) for message in messages],
    }
    body.update({key: value for key, value in options.items() if value is not None})
    if tools:
        body["tools"] = [dict(tool) for tool in tools]
    return body


def error_message(data: Any, text: str) -> str:
    """The message of an error reply (``error.message`` of its JSON, else its text), quoted."""
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            return quoted(str(error["message"]))
        if isinstance(error, str):
            return quoted(error)
    return quoted(text) or "no error message"


def quoted(text: str) -> str:
    """The start of what an endpoint said, on one line, at most :data:`MAX_QUOTED_CHARS`."""
    line = " ".join(text.split())
    return line if len(line) <= MAX_QUOTED_CHARS else line[:MAX_QUOTED_CHARS] + "..."

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

Errors are reported as :class:`ModelHttpError` (an HTTP status with the start of the provider's
message, at most :data:`MAX_QUOTED_CHARS`) or the underlying httpx exception;
:mod:`agentflows.agents.model` decides what may be retried.
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from agentflows.agents import egress

#: Where ``openai/...`` models go when the Agent sets no apiBase.
OPENAI_API_BASE = "https://api.openai.com/v1"
#: How much of an endpoint's error reply is quoted (into the node's error, the run's status).
MAX_QUOTED_CHARS = 300
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


class ModelHttpError(Exception):
    """The endpoint answered with an HTTP error; ``message`` is the provider's explanation."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code


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
) -> dict[str, Any]:
    """POST one chat completion and return the reply's JSON."""
    url = (api_base or OPENAI_API_BASE).rstrip("/") + "/chat/completions"
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    guard = egress.Guard.for_url(url)
    async with egress.async_client(guard, timeout=timeout_seconds, verify=_ssl_context()) as client:
        response = await client.post(url, json=dict(body), headers=headers)
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
        raise ModelHttpError(response.status_code, error_message(data, response.text))
    if not isinstance(data, dict) or not data.get("choices"):
        raise ModelHttpError(502, f"the endpoint's reply has no choices: {quoted(response.text)}")
    return data


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

"""The model client: one chat completion, with usage and cost.

Called by :mod:`agentflows.agents.turn` (every step of an agent turn), by
:mod:`agentflows.agents.compression` (summaries) and by :mod:`agentflows.agents.host` (``llm``
nodes). Two paths, one result:

- OpenAI-compatible endpoints (``openai/...`` models, bare model names, and models with an
  ``apiBase`` whose provider speaks the OpenAI wire format) are called directly over httpx
  (:mod:`agentflows.agents.openai_compat`): litellm takes 3-4 s to import, which a runner pod
  would otherwise pay before its first model call.
- every other provider goes through ``litellm.acompletion``.

Everything a :class:`~agentflows.api.agent.ModelSpec` says is sent: model string, apiBase, the
API key, temperature, topP, maxTokens and timeoutSeconds. ``retries`` is applied here, to errors
where another try may help (timeouts, connection errors, and the statuses of
:func:`agentflows.api.retry.status_may_help` with a provider's 409: 408/409/425/429 and 5xx),
with exponential backoff (0.5 s doubling to 8 s), never sooner than the provider's
``Retry-After`` asks; one that asks for more than :data:`MAX_RETRY_AFTER_SECONDS` fails at once,
as does a 400 or 401.

The API key comes from the spec's ``apiKey.secretKeyRef`` (the value looked up under
:func:`agentflows.agents.secrets.secret_env_name`: in a pod, a file of its secrets volume)
when it has one. Otherwise the key depends on
where the request goes, because a Flow may come from anyone and must not send the key of
whoever runs it to an endpoint of its choosing:

- no ``apiBase``: the request goes to the provider's own endpoint, with the provider's usual
  variable from the host's environment (:data:`PROVIDER_KEY_ENV`), or litellm's own lookup;
- an ``apiBase``: never a key from the environment. A placeholder is sent instead (local servers
  such as vLLM or Ollama need no key, but clients insist on one, and litellm would otherwise look
  the provider's variable up itself). Providers that sign requests with the host's cloud
  credentials (:data:`AMBIENT_CREDENTIAL_PROVIDERS`) are refused an ``apiBase`` without
  ``apiKey``: their signature or token would go to that endpoint.

An ``apiBase`` goes through the one address guard (:mod:`agentflows.agents.egress`) before
any request, on both paths: its own host, as written, is the only one allowed (loopback and
private addresses when written literally, as for a local vLLM or an in-cluster service; cloud
metadata, link-local and other never-called addresses never; no other spelling of an IPv4
address). A refusal is a permanent error naming ``model.apiBase``. The direct path connects through
the guard, to the address it checked, and so do the litellm providers of
:data:`GUARDED_LITELLM_PROVIDERS` (given the guard's client; its redirects are not followed);
the other litellm providers' own clients resolve the name again.
What an endpoint says in an error is quoted on one line, cut to a few hundred characters:
``model M failed (HTTP S): provider: message`` — never litellm's traceback or class name. On the
litellm path the HTTP status is the provider's own (the innermost error litellm raised from), so
a 404 litellm re-raises as a 500 stays a permanent 404. ``apiBase`` is normalised once, in
:func:`litellm_api_base` (a trailing ``/v1`` for providers whose route starts at the root).

With a :class:`~agentflows.agents.streaming.Writer` (a host that shows answers as they come,
see :mod:`agentflows.agents.streaming`), the call is a stream on both paths (the direct one's
``stream: true`` with usage, litellm's ``stream=True`` with ``include_usage``), assembled into
the same :class:`ModelReply`: content, tool calls, usage and cost as without it. A stream that
breaks off mid-way is an error of the attempt, retried or failed by the same rules as a failed
request; the writer is told each retry starts over.

litellm is imported on the first call that needs it, never at module import: ``agentflows
--help`` and the dry run stay fast. Costs come from litellm's bundled price table
(:mod:`agentflows.agents.costs`; ``LITELLM_LOCAL_MODEL_COST_MAP``, no network); a model missing
from it costs 0 and the reply says ``cost_known = False``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar

from agentflows.agents import costs, egress, secrets, streaming
from agentflows.agents.litellm_import import import_litellm
from agentflows.api import agent as agent_api
from agentflows.api import common, retry
from agentflows.api import flow as flow_api
from agentflows.engine import capabilities, spans

#: The variable each provider's API key is usually found in. A model name without a provider
#: prefix is an OpenAI model, as in litellm.
PROVIDER_KEY_ENV: dict[str, str] = {
    "openai": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "gemini": "GEMINI_API_KEY",
    "mistral": "MISTRAL_API_KEY",
    "groq": "GROQ_API_KEY",
    "azure": "AZURE_API_KEY",
    "bedrock": "AWS_ACCESS_KEY_ID",
}
#: Providers whose variable above is the API key itself (Bedrock signs with AWS credentials).
_KEY_IS_API_KEY = frozenset({"openai", "anthropic", "gemini", "mistral", "groq", "azure"})
#: Providers whose calls carry the host's cloud credentials (AWS signatures, Google tokens).
AMBIENT_CREDENTIAL_PROVIDERS = frozenset({"bedrock", "sagemaker", "vertex_ai", "vertex_ai_beta"})
#: Providers whose litellm call goes through an httpx client it is given: with an ``apiBase``,
#: that client is the address guard's (other litellm providers bring their own SDK's client).
GUARDED_LITELLM_PROVIDERS = frozenset({"anthropic", "gemini", "ollama", "ollama_chat"})
#: Sent to an ``apiBase`` when the spec names no ``apiKey`` (see module docstring).
PLACEHOLDER_API_KEY = "not-needed"
#: A node's model error (one line) is cut to this length.
_MAX_ERROR_CHARS = 500
#: litellm's "litellm.NotFoundError: AnthropicException - " in front of an endpoint's message.
_LITELLM_PREFIX = re.compile(r"^(litellm\.\w+:\s*)?(\w+Exception( \w+Error)?\s*-\s*)?")
#: litellm providers whose path appends its own versioned route (``/v1/messages``,
#: ``/api/chat``) to the server's root: a trailing ``/v1`` on their ``apiBase`` (the root's
#: OpenAI-compatible prefix, as users write it) is removed, see :func:`litellm_api_base`.
_ROOT_RELATIVE_PROVIDERS = frozenset({"anthropic", "ollama", "ollama_chat"})
#: First wait before retrying a failed model call; it doubles with each retry, up to the cap.
RETRY_BACKOFF_SECONDS = 0.5
MAX_BACKOFF_SECONDS = 8.0
#: The longest ``Retry-After`` a model call waits out; a provider asking for more fails the call.
MAX_RETRY_AFTER_SECONDS = 60.0

_T = TypeVar("_T")
log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ToolCallRequest:
    """A tool call the model asked for; ``arguments`` is the model's JSON text, unparsed."""

    id: str
    name: str
    arguments: str


@dataclasses.dataclass
class ModelReply:
    """The assistant message of one completion, with its usage."""

    content: str
    tool_calls: list[ToolCallRequest]
    usage: common.Usage
    cost_known: bool
    finish_reason: str | None
    #: The provider's reply as JSON (for the envelope's ``raw``).
    raw: dict[str, Any]

    def assistant_message(self) -> dict[str, Any]:
        """Return the message to append to the conversation before the tool results."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content or None}
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in self.tool_calls
            ]
        return message


def supports(capability: Literal["vision", "pdf_input"], model_name: str) -> bool:
    """Whether litellm's model table says ``model_name`` takes images or PDFs (unknown: no)."""
    check = getattr(import_litellm(), f"supports_{capability}")
    try:
        return bool(check(model=model_name))
    except Exception:  # litellm raises for models it cannot map to a provider
        return False


def provider_of(model_name: str) -> str:
    """Return the litellm provider prefix of a model string (``openai`` when there is none)."""
    prefix, slash, _ = model_name.partition("/")
    return prefix.lower() if slash else "openai"


def api_key_for(
    model: agent_api.ModelSpec, env: Mapping[str, str], redactor: secrets.Redactor
) -> str | None:
    """Return the API key to send, or None to let litellm look for one (see module doc).

    Raises a permanent CapabilityError for an ``apiBase`` that would receive the host's cloud
    credentials.
    """
    if model.api_key is not None:
        return redactor.add(secrets.resolve(model.api_key, env, field="model.apiKey"))
    provider = provider_of(model.name)
    if model.api_base:
        if provider in AMBIENT_CREDENTIAL_PROVIDERS:
            raise capabilities.CapabilityError(
                f"model.apiBase: {model.name} would sign its requests to {model.api_base} with "
                f"this host's {provider} credentials, which go only to {provider}'s own "
                "endpoint; remove apiBase, or set model.apiKey to a Secret meant for it"
            )
        return PLACEHOLDER_API_KEY
    variable = PROVIDER_KEY_ENV.get(provider)
    if variable and provider in _KEY_IS_API_KEY and env.get(variable):
        return redactor.add(env[variable])
    return None


async def complete(
    model: agent_api.ModelSpec,
    messages: Sequence[Mapping[str, Any]],
    *,
    env: Mapping[str, str],
    redactor: secrets.Redactor,
    tools: Sequence[Mapping[str, Any]] = (),
    stream: streaming.Writer | None = None,
) -> ModelReply:
    """Make one chat completion; raise CapabilityError (retryable when it may help) on failure.

    With ``stream``, the answer's text goes to it as it is written (see module docstring).
    The call is a ``chat`` span with the GenAI semantic conventions' attributes; the messages
    and the reply go on it (redacted) only when the tracer captures content.
    """
    with spans.span(f"chat {model.name}", _request_attributes(model)) as span:
        if spans.capture_content():
            span.set({"gen_ai.input.messages": redactor(_json(messages))})
        try:
            reply = await _complete(
                model, messages, env=env, redactor=redactor, tools=tools, stream=stream
            )
        except BaseException:
            if stream is not None:
                stream.abandon()
            raise
        if stream is not None:
            stream.end()
        span.set(_reply_attributes(reply, redactor))
        return reply


def _request_attributes(model: agent_api.ModelSpec) -> spans.Attributes:
    """GenAI attributes of a chat request (never the API key or base URL's credentials)."""
    attributes: dict[str, spans.AttributeValue] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider_of(model.name),
        "gen_ai.request.model": model.name,
    }
    optional = {
        "gen_ai.request.temperature": model.temperature,
        "gen_ai.request.top_p": model.top_p,
        "gen_ai.request.max_tokens": model.max_tokens,
    }
    attributes.update({key: value for key, value in optional.items() if value is not None})
    return attributes


def _reply_attributes(reply: ModelReply, redactor: secrets.Redactor) -> spans.Attributes:
    attributes: dict[str, spans.AttributeValue] = {
        "gen_ai.usage.input_tokens": reply.usage.prompt_tokens,
        "gen_ai.usage.output_tokens": reply.usage.completion_tokens,
        "agentflows.usage.cost_usd": reply.usage.cost_usd,
    }
    if reply.finish_reason:
        attributes["gen_ai.response.finish_reasons"] = (reply.finish_reason,)
    for key, raw_key in (("gen_ai.response.model", "model"), ("gen_ai.response.id", "id")):
        if isinstance(reply.raw.get(raw_key), str):
            attributes[key] = reply.raw[raw_key]
    if spans.capture_content():
        attributes["gen_ai.output.messages"] = redactor(_json([reply.assistant_message()]))
    return attributes


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


async def _complete(
    model: agent_api.ModelSpec,
    messages: Sequence[Mapping[str, Any]],
    *,
    env: Mapping[str, str],
    redactor: secrets.Redactor,
    tools: Sequence[Mapping[str, Any]],
    stream: streaming.Writer | None,
) -> ModelReply:
    api_key = api_key_for(model, env, redactor)
    await check_api_base(model)
    if openai_compat_handles(model):
        return await _complete_direct(model, messages, api_key, redactor, tools, stream)
    litellm = import_litellm()
    kwargs: dict[str, Any] = {
        "model": model.name,
        "messages": [dict(message) for message in messages],
        "timeout": model.timeout_seconds,
        # Retries are ours (below): litellm's would retry a 400 or a 401 as well.
        "num_retries": 0,
    }
    optional = {
        "api_base": litellm_api_base(model),
        "api_key": api_key,
        "temperature": model.temperature,
        "top_p": model.top_p,
        "max_tokens": model.max_tokens,
    }
    kwargs.update({key: value for key, value in optional.items() if value is not None})
    if tools:
        kwargs["tools"] = [dict(tool) for tool in tools]
    if stream is not None:
        kwargs.update(stream=True, stream_options={"include_usage": True})
    if not (model.api_base and provider_of(model.name) in GUARDED_LITELLM_PROVIDERS):
        return await _litellm_with_retries(litellm, kwargs, model, redactor, stream)
    from litellm.llms.custom_httpx.http_handler import AsyncHTTPHandler

    handler = AsyncHTTPHandler(timeout=model.timeout_seconds)
    handler.client = egress.async_client(
        egress.Guard.for_url(model.api_base), timeout=model.timeout_seconds
    )
    try:
        return await _litellm_with_retries(
            litellm, {**kwargs, "client": handler}, model, redactor, stream
        )
    finally:
        await handler.client.aclose()


async def _retried(
    model: agent_api.ModelSpec,
    stream: streaming.Writer | None,
    call: Callable[[], Awaitable[_T]],
    error_of: Callable[[Exception, int], capabilities.CapabilityError],
) -> _T:
    """``call()``, tried again up to ``model.retries`` times while its error is retryable.

    ``error_of(exc, attempts)`` turns a failure into the error raised; a stream that broke
    off starts over.
    """
    backoff = retry.Backoff(
        initial=RETRY_BACKOFF_SECONDS, cap=MAX_BACKOFF_SECONDS, attempts=model.retries + 1
    )
    tries = backoff.tries()
    while True:
        try:
            return await call()
        except Exception as exc:
            error = error_of(exc, tries.failures + 1)
            asked = _retry_after(exc)
            waitable = asked is None or asked <= MAX_RETRY_AFTER_SECONDS
            delay = tries.failed(asked) if error.retryable and waitable else None
            if delay is None and error.retryable and not waitable:
                raise capabilities.CapabilityError(
                    f"{error}; the provider asked to wait {asked:g}s (Retry-After), more than "
                    f"the {MAX_RETRY_AFTER_SECONDS:g}s a call waits",
                    retryable=True,
                    source=error.source,
                ) from None
            if delay is None:
                raise error from None
            told = retry.retry_after_note(asked)
            log.info("model %s: %s; retrying in %.1fs%s", model.name, error, delay, told)
        if stream is not None:
            stream.restart()
        await asyncio.sleep(delay)


def _retry_after(exc: Exception) -> float | None:
    """The wait a failed call's answer asked for: our client's error, or litellm's response."""
    asked = getattr(exc, "retry_after", None)
    if isinstance(asked, int | float):
        return float(asked)
    headers = getattr(getattr(exc, "response", None), "headers", None)
    if isinstance(headers, Mapping):
        value = headers.get("retry-after")
        return retry.retry_after(value) if isinstance(value, str) else None
    return None


async def _litellm_with_retries(
    litellm: Any,
    kwargs: dict[str, Any],
    model: agent_api.ModelSpec,
    redactor: secrets.Redactor,
    stream: streaming.Writer | None,
) -> ModelReply:
    async def once() -> Any:
        response = await litellm.acompletion(**kwargs)
        if stream is not None:
            response = await _litellm_stream(litellm, response, kwargs["messages"], stream)
        return response

    response = await _retried(
        model, stream, once, lambda exc, n: _model_error(model.name, exc, redactor, n)
    )
    return _reply(litellm, response)


async def _litellm_stream(
    litellm: Any, chunks: Any, messages: list[dict[str, Any]], stream: streaming.Writer
) -> Any:
    """Pass a litellm stream's text on and return the response its chunks build."""
    received = []
    async for chunk in chunks:
        received.append(chunk)
        for choice in getattr(chunk, "choices", None) or []:
            text = getattr(getattr(choice, "delta", None), "content", None)
            if text:
                stream.piece(str(text))
    return litellm.stream_chunk_builder(received, messages=messages)


def litellm_api_base(model: agent_api.ModelSpec) -> str | None:
    """The ``apiBase`` as litellm's provider path wants it: the one place it is normalised.

    Anthropic's path appends ``/v1/messages`` and Ollama's ``/api/chat`` (or ``/api/generate``)
    to the server's root, so an ``apiBase`` written as ``http://host:port/v1`` (as for the
    OpenAI-compatible path) loses its trailing ``/v1``: ``/v1/messages``, never
    ``/v1/v1/messages``. Other providers' ``apiBase`` is passed as written.
    """
    base = model.api_base
    if base and provider_of(model.name) in _ROOT_RELATIVE_PROVIDERS:
        stripped = base.rstrip("/")
        if stripped.endswith("/v1"):
            return stripped[: -len("/v1")]
    return base


async def check_api_base(model: agent_api.ModelSpec) -> None:
    """Refuse an ``apiBase`` the address guard refuses: a permanent CapabilityError."""
    if not model.api_base:
        return
    guard = egress.Guard.for_url(model.api_base)
    try:
        await guard.resolve(*guard.check_url(model.api_base))
    except (egress.HostNotAllowed, egress.InvalidUrl) as exc:
        raise capabilities.CapabilityError(
            f"model {model.name}: model.apiBase: {exc}", source=flow_api.RetryOn.MODEL
        ) from None


def openai_compat_handles(model: agent_api.ModelSpec) -> bool:
    """Tell whether ``model`` is called over the direct OpenAI-compatible path."""
    from agentflows.agents import openai_compat

    return openai_compat.handles(provider_of(model.name), model.api_base)


async def _complete_direct(
    model: agent_api.ModelSpec,
    messages: Sequence[Mapping[str, Any]],
    api_key: str | None,
    redactor: secrets.Redactor,
    tools: Sequence[Mapping[str, Any]],
    stream: streaming.Writer | None,
) -> ModelReply:
    """One completion over :mod:`agentflows.agents.openai_compat`, retried like litellm's."""
    from agentflows.agents import openai_compat

    body = openai_compat.request_body(
        model.name,
        messages,
        tools,
        {"temperature": model.temperature, "top_p": model.top_p, "max_tokens": model.max_tokens},
    )

    async def once() -> dict[str, Any]:
        return await openai_compat.chat_completion(
            api_base=model.api_base,
            api_key=api_key,
            body=body,
            timeout_seconds=model.timeout_seconds,
            stream=stream.piece if stream is not None else None,
        )

    data = await _retried(
        model, stream, once, lambda exc, n: _direct_error(model.name, exc, redactor, n)
    )
    return _direct_reply(model.name, data)


def _direct_reply(model_name: str, data: dict[str, Any]) -> ModelReply:
    choice = data["choices"][0]
    message = choice.get("message") or {}
    calls = [
        ToolCallRequest(
            id=str(call.get("id")),
            name=str((call.get("function") or {}).get("name")),
            arguments=str((call.get("function") or {}).get("arguments") or "{}"),
        )
        for call in (message.get("tool_calls") or [])
    ]
    usage = data.get("usage") or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    price = costs.price(model_name, prompt, completion)
    return ModelReply(
        content=str(message.get("content") or ""),
        tool_calls=calls,
        usage=common.Usage(
            prompt_tokens=prompt,
            completion_tokens=completion,
            cost_usd=price.cost_usd,
            llm_calls=1,
        ),
        cost_known=price.known,
        finish_reason=choice.get("finish_reason"),
        raw=data,
    )


def _direct_error(
    model_name: str, exc: Exception, redactor: secrets.Redactor, attempts: int
) -> capabilities.CapabilityError:
    import httpx

    from agentflows.agents import openai_compat

    status = exc.status_code if isinstance(exc, openai_compat.ModelHttpError) else None
    retryable = isinstance(exc, httpx.TimeoutException | httpx.TransportError) or (
        isinstance(exc, openai_compat.ModelHttpError) and exc.retryable
    )
    if isinstance(exc, httpx.TimeoutException):
        text = f"no reply within the model's timeoutSeconds ({type(exc).__name__})"
    else:
        text = redactor(str(exc)).strip() or type(exc).__name__
    return _error(model_name, text, status, attempts, retryable)


def _error(
    model_name: str, text: str, status: int | None, attempts: int, retryable: bool
) -> capabilities.CapabilityError:
    text = " ".join(text.split())
    if len(text) > _MAX_ERROR_CHARS:
        text = text[:_MAX_ERROR_CHARS] + "..."
    where = f" (HTTP {status})" if status is not None else ""
    tries = f" after {attempts} attempts" if attempts > 1 else ""
    return capabilities.CapabilityError(
        f"model {model_name} failed{where}{tries}: {text}",
        retryable=retryable,
        source=flow_api.RetryOn.MODEL,
    )


def _reply(litellm: Any, response: Any) -> ModelReply:
    choice = response.choices[0]
    message = choice.message
    calls = [
        ToolCallRequest(
            id=str(call.id),
            name=str(call.function.name),
            arguments=str(call.function.arguments or "{}"),
        )
        for call in (getattr(message, "tool_calls", None) or [])
    ]
    usage = getattr(response, "usage", None)
    cost, known = _cost(litellm, response)
    return ModelReply(
        content=str(message.content or ""),
        tool_calls=calls,
        usage=common.Usage(
            prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
            cost_usd=cost,
            llm_calls=1,
        ),
        cost_known=known,
        finish_reason=getattr(choice, "finish_reason", None),
        raw=response.model_dump(mode="json"),
    )


def _cost(litellm: Any, response: Any) -> tuple[float, bool]:
    """Cost from litellm's table; (0, False) for a model the table does not know."""
    try:
        cost = litellm.completion_cost(completion_response=response)
    except Exception:
        return 0.0, False
    return max(float(cost or 0.0), 0.0), True


def _model_error(
    model_name: str, exc: Exception, redactor: secrets.Redactor, attempts: int
) -> capabilities.CapabilityError:
    """One line for a failed litellm call, classified by the endpoint's real HTTP status.

    litellm's exception class is not the status: a reply it cannot map becomes an
    ``APIConnectionError`` or ``InternalServerError`` (status 500, a traceback in its text).
    The status and message of the provider's own error, the innermost of the chain litellm
    raised from, decide; the class only when no HTTP status came back (timeout, refused).
    """
    litellm = import_litellm()
    origin: BaseException = exc
    for cause in _chain(exc):
        if _http_status(cause) is not None:
            origin = cause
    status = _http_status(origin)
    if status is not None:
        retryable = retry.status_may_help(status, conflict_passes=True)
    else:
        retryable = isinstance(exc, litellm.Timeout | litellm.APIConnectionError)
    if isinstance(exc, litellm.Timeout):
        text = f"no reply within the model's timeoutSeconds ({type(exc).__name__})"
    else:
        text = _litellm_message(origin)
    return _error(
        model_name, f"{provider_of(model_name)}: {redactor(text)}", status, attempts, retryable
    )


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from, outermost first."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain and len(chain) < 16:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _http_status(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) and 100 <= status <= 599 else None


def _litellm_message(exc: BaseException) -> str:
    """What the endpoint said (its JSON error message), without litellm's prefix or traceback."""
    from agentflows.agents import openai_compat

    message = getattr(exc, "message", None)
    text = message if isinstance(message, str) and message else str(exc)
    text = text.split("Traceback (most recent call last)", 1)[0].strip()
    # litellm prefixes "litellm.NotFoundError: AnthropicException - "; the class says nothing.
    text = _LITELLM_PREFIX.sub("", text, count=1)
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    return openai_compat.error_message(data, text) if text else type(exc).__name__

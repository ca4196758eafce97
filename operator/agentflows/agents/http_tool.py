"""The ``http`` tool: call an HTTP endpoint with the model's arguments.

Used through :class:`agentflows.agents.tools.SpecToolProvider` (agent tools) and directly by
``tool`` nodes. The URL, headers and body are templates over the scope ``{args}``, evaluated
with the engine's expressions (``{{ .args.city }}`` interpolates, a string starting with ``=``
is a jq program). Values interpolated into the URL are percent-encoded, so an argument can fill
a path segment or a query value but never add a path, a query or a host of its own.

Requests go only where :mod:`agentflows.agents.egress` allows: ``allowHosts`` (``*.example.com``
matches subdomains), or, when it is empty, the host written in the URL template itself; a
template whose host is itself templated needs ``allowHosts``. Loopback and private addresses
only through a host named exactly, link-local and cloud metadata addresses never; the connection
goes to the address that was checked. Redirects are followed one checked hop at a time (at most
:data:`MAX_REDIRECTS`); a hop that changes the scheme, host or port carries no credentials
(``Authorization``, cookies, ``secretHeaders``). A URL whose port is not a number from 1 to
65535 (say, filled in from the model's arguments) is an error for the model, like any other
unusable URL.

The query written in the URL template is kept. Without a ``body`` template, a GET adds the
arguments to it as query parameters (minus those the URL template already uses) and other
methods send them as the JSON body. A ``body`` that evaluates to a string is sent as it is (with
the ``Content-Type`` the headers give, none otherwise); an object with a ``Content-Type`` of
``application/x-www-form-urlencoded`` is sent form-encoded; any other value is sent as JSON.
The response is read up to ``maxResponseBytes``; the result is the parsed JSON, or the text
when it is not JSON. A status of 400 or more is an error for the model, with the start of the
body.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

import httpx

from agentflows.agents import egress, secrets, tools
from agentflows.api import agent as agent_api
from agentflows.api import errors, retry
from agentflows.engine import capabilities, expressions

_INTERPOLATION = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_ARG_REFERENCE = re.compile(r"\.args\.([A-Za-z_][A-Za-z0-9_]*)")
#: Characters left as they are when an argument is put into a URL (":" for host:port).
_URL_SAFE = ":"
_MAX_ERROR_BODY_CHARS = 500
_FORM = "application/x-www-form-urlencoded"
#: Redirects followed before the call fails.
MAX_REDIRECTS = 5


class FetchError(errors.AgentflowsError):
    """A file could not be fetched (:meth:`HttpToolRunner.fetch`); the message says why."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        #: A timeout, a lost connection, an answer of api.retry.status_may_help (408,
        #: 425, 429, 5xx): fetching again later may work.
        self.retryable = retryable


class HttpToolRunner:
    """One compiled http tool; :meth:`run` makes a call."""

    def __init__(
        self,
        name: str,
        spec: agent_api.HttpTool,
        env: Mapping[str, str],
        redactor: secrets.Redactor,
    ) -> None:
        self.name = name
        self.spec = spec
        self._env = env
        self._redactor = redactor
        try:
            self._url_parts = _compile_url(spec.url)
            self._headers = expressions.compile_template(dict(spec.headers))
            self._body = expressions.compile_template(spec.body)
        except expressions.ExpressionError as exc:
            raise capabilities.CapabilityError(f"tool {name}: http: {exc}") from None
        self._guard = egress.Guard.for_url(spec.url, spec.allow_hosts)
        self._url_args = set(_ARG_REFERENCE.findall(spec.url))

    async def run(self, args: Any) -> tools.ToolOutcome:
        """Call the endpoint: the result, or an error for the model."""
        try:
            value = await asyncio.wait_for(self._request(args), self.spec.timeout_seconds)
        except (TimeoutError, httpx.TimeoutException):
            return tools.ToolOutcome.failure(
                f"{self.spec.method} {self.name}: no response within "
                f"{self.spec.timeout_seconds:g} s",
                timeout=True,
            )
        except (egress.HostNotAllowed, egress.InvalidUrl) as exc:
            return tools.ToolOutcome.failure(self._redactor(f"{self.name}: {exc}"))
        except _ResponseError as exc:
            text = self._redactor(f"{self.name}: {exc}")
            return tools.ToolOutcome.failure(text, retryable=exc.retryable)
        except httpx.TransportError as exc:  # refused, reset: the endpoint may be back soon
            text = self._redactor(f"{self.name}: {exc}")
            return tools.ToolOutcome.failure(text, retryable=True)
        except (httpx.HTTPError, httpx.InvalidURL, expressions.ExpressionError) as exc:
            return tools.ToolOutcome.failure(self._redactor(f"{self.name}: {exc}"))
        # A server may echo what it was sent, secret headers included.
        return tools.ToolOutcome.success(self._redactor.value(value))

    async def fetch(self, url: str) -> bytes:
        """GET ``url`` (no templating) under the same guard and return the body's bytes.

        Used for reference files (:mod:`agentflows.agents.files`); raise :class:`FetchError`.
        """
        try:
            self._guard.check_url(url)
            return await asyncio.wait_for(
                self._send(url, {"headers": {}}, set(), raw=True), self.spec.timeout_seconds
            )
        except (TimeoutError, httpx.TimeoutException):
            message, retryable = f"no response within {self.spec.timeout_seconds:g} s", True
        except _ResponseError as exc:
            message, retryable = str(exc), exc.retryable
        except httpx.TransportError as exc:
            message, retryable = str(exc), True
        except (egress.HostNotAllowed, egress.InvalidUrl, httpx.HTTPError) as exc:
            message, retryable = str(exc), False
        raise FetchError(self._redactor(f"{self.name}: {message}"), retryable=retryable)

    async def _request(self, args: Any) -> Any:
        scope = expressions.Scope({"args": args})
        url = self._render_url(scope)
        self._guard.check_url(url)
        headers = {k: str(v) for k, v in expressions.evaluate(self._headers, scope).items()}
        for header, ref in self.spec.secret_headers.items():
            headers[header] = self._redactor.add(
                secrets.resolve(ref, self._env, field=f"http.secretHeaders.{header}")
            )
        request: dict[str, Any] = {"headers": headers}
        if self.spec.body is not None:
            request.update(_encoded_body(expressions.evaluate(self._body, scope), headers))
        elif self.spec.method == "GET":
            url = _with_query(url, self._query(args))
        elif args is not None:
            request["json"] = args

        return await self._send(url, request, set(self.spec.secret_headers))

    async def _send(
        self, url: str, request: dict[str, Any], secret_headers: set[str], *, raw: bool = False
    ) -> Any:
        """Send through the guard; follow redirects one checked hop at a time.

        The result is the parsed body, or with ``raw`` its bytes (a status of 400 or more is
        an error either way).
        """
        method = self.spec.method
        origin = url
        async with egress.async_client(self._guard, timeout=self.spec.timeout_seconds) as client:
            for _ in range(MAX_REDIRECTS + 1):
                host, _ = self._guard.check_url(url)
                headers = dict(request.get("headers") or {})
                if not egress.same_origin(url, origin):
                    headers = egress.credentials_dropped(headers, secret_headers)
                sent = client.build_request(method, url, **{**request, "headers": headers})
                response = await client.send(sent, stream=True)
                try:
                    if response.is_redirect and "location" in response.headers:
                        url = urllib.parse.urljoin(url, response.headers["location"])
                        if response.status_code == 303 or (
                            response.status_code in (301, 302) and method == "POST"
                        ):
                            method = "GET"
                            request = {"headers": request.get("headers")}
                        continue
                    body = await self._read_bounded(response)
                    if raw:
                        _check_status(response, body, host)
                        return body
                    return _result(response, body, host)
                finally:
                    await response.aclose()
        raise _ResponseError(f"more than {MAX_REDIRECTS} redirects")

    def _render_url(self, scope: expressions.Scope) -> str:
        pieces: list[str] = []
        for part in self._url_parts:
            if isinstance(part, str):
                pieces.append(part)
            else:
                value = expressions.evaluate(part, scope)
                text = (
                    "" if value is None else value if isinstance(value, str) else json.dumps(value)
                )
                pieces.append(urllib.parse.quote(text, safe=_URL_SAFE))
        return "".join(pieces)

    def _query(self, args: Any) -> dict[str, str]:
        if not isinstance(args, dict):
            return {}
        return {
            str(key): value if isinstance(value, str) else json.dumps(value)
            for key, value in args.items()
            if key not in self._url_args and value is not None
        }

    async def _read_bounded(self, response: httpx.Response) -> bytes:
        limit = self.spec.max_response_bytes
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > limit:
                raise _ResponseError(f"response is larger than maxResponseBytes={limit}")
            chunks.append(chunk)
        return b"".join(chunks)


class _ResponseError(errors.AgentflowsError):
    """The endpoint answered, but not with something the tool can return."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        #: The endpoint said "later" (408, 425, 429 or 5xx): the same call may succeed then.
        self.retryable = retryable


def _compile_url(template: str) -> list[str | expressions.Template]:
    parts: list[str | expressions.Template] = []
    for index, piece in enumerate(_INTERPOLATION.split(template)):
        if index % 2:
            parts.append(expressions.compile_expression(piece.strip()))
        elif piece:
            parts.append(piece)
    return parts


def _encoded_body(value: Any, headers: Mapping[str, str]) -> dict[str, Any]:
    """The request arguments sending ``value`` as the body, by its type and the Content-Type."""
    if isinstance(value, str):
        return {"content": value.encode()}
    content_type = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
    if isinstance(value, dict) and content_type.split(";")[0].strip().lower() == _FORM:
        fields = {
            str(k): v if isinstance(v, str) else json.dumps(v)
            for k, v in value.items()
            if v is not None
        }
        return {"content": urllib.parse.urlencode(fields).encode()}
    return {"json": value}


def _with_query(url: str, params: Mapping[str, str]) -> str:
    """``url`` with ``params`` added to the query it already has (each value percent-encoded)."""
    if not params:
        return url
    parsed = urllib.parse.urlsplit(url)
    added = urllib.parse.urlencode(params, quote_via=urllib.parse.quote)
    query = f"{parsed.query}&{added}" if parsed.query else added
    return urllib.parse.urlunsplit(parsed._replace(query=query))


def _check_status(response: httpx.Response, body: bytes, host: str) -> None:
    """Raise _ResponseError for a status of 400 or more, quoting the start of the body."""
    if response.status_code >= 400:
        text = body[: _MAX_ERROR_BODY_CHARS * 4].decode(
            response.encoding or "utf-8", errors="replace"
        )
        raise _ResponseError(
            f"HTTP {response.status_code} from {host}: {text[:_MAX_ERROR_BODY_CHARS]}",
            retryable=retry.status_may_help(response.status_code),
        )


def _result(response: httpx.Response, body: bytes, host: str) -> Any:
    _check_status(response, body, host)
    text = body.decode(response.encoding or "utf-8", errors="replace")
    try:
        return json.loads(text) if text.strip() else None
    except ValueError:
        return text

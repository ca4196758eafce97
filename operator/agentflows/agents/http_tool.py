"""The ``http`` tool: call an HTTP endpoint with the model's arguments.

Used through :class:`agentflows.agents.tools.SpecToolProvider` (agent tools) and directly by
``tool`` nodes. The URL, headers and body are templates over the scope ``{args}``, evaluated
with the engine's expressions (``{{ .args.city }}`` interpolates, a string starting with ``=``
is a jq program). Values interpolated into the URL are percent-encoded, so an argument can fill
a path segment or a query value but never add a path, a query or a host of its own.

Requests go only to allowed hosts: ``allowHosts`` (``*.example.com`` matches subdomains), or,
when it is empty, the host written in the URL template itself; a template whose host is itself
templated needs ``allowHosts``. The check runs on every request, redirects included.

Without a ``body`` template, a GET sends the arguments as query parameters (minus those the URL
template already uses) and other methods send them as the JSON body. The response is read up to
``maxResponseBytes``; the result is the parsed JSON, or the text when it is not JSON. A status
of 400 or more is an error for the model, with the start of the body.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

import httpx

from agentflows.agents import secrets, tools
from agentflows.api import agent as agent_api
from agentflows.engine import capabilities, expressions

_INTERPOLATION = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_ARG_REFERENCE = re.compile(r"\.args\.([A-Za-z_][A-Za-z0-9_]*)")
#: Characters left as they are when an argument is put into a URL (":" for host:port).
_URL_SAFE = ":"
_MAX_ERROR_BODY_CHARS = 500


class HostNotAllowed(Exception):
    """A request (or a redirect) would go to a host the tool may not reach."""


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
        self._allowed = [host.lower() for host in spec.allow_hosts] or _template_host(spec.url)
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
        except HostNotAllowed as exc:
            return tools.ToolOutcome.failure(str(exc))
        except (httpx.HTTPError, expressions.ExpressionError, _ResponseError) as exc:
            return tools.ToolOutcome.failure(self._redactor(f"{self.name}: {exc}"))
        return tools.ToolOutcome.success(value)

    async def _request(self, args: Any) -> Any:
        scope = expressions.Scope({"args": args})
        url = self._render_url(scope)
        self._check_host(url)
        headers = {k: str(v) for k, v in expressions.evaluate(self._headers, scope).items()}
        for header, ref in self.spec.secret_headers.items():
            headers[header] = self._redactor.add(
                secrets.resolve(ref, self._env, field=f"http.secretHeaders.{header}")
            )
        request: dict[str, Any] = {"headers": headers}
        if self.spec.body is not None:
            request["json"] = expressions.evaluate(self._body, scope)
        elif self.spec.method == "GET":
            request["params"] = self._query(args)
        elif args is not None:
            request["json"] = args

        async def check_redirect(req: httpx.Request) -> None:
            self._check_host(str(req.url))

        async with (
            httpx.AsyncClient(
                timeout=self.spec.timeout_seconds,
                follow_redirects=True,
                max_redirects=5,
                event_hooks={"request": [check_redirect]},
                trust_env=True,
            ) as client,
            client.stream(self.spec.method, url, **request) as response,
        ):
            body = await self._read_bounded(response)
            return _result(response, body)

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

    def _check_host(self, url: str) -> None:
        parsed = urllib.parse.urlsplit(url)
        host = (parsed.hostname or "").lower()
        if parsed.scheme not in ("http", "https") or not host:
            raise HostNotAllowed(f"{self.name}: {url!r} is not an http(s) URL with a host")
        if not any(_host_matches(host, allowed) for allowed in self._allowed):
            allowed = ", ".join(self._allowed) or "none (the URL template's host is templated)"
            raise HostNotAllowed(
                f"{self.name}: host {host!r} is not allowed (allowHosts: {allowed})"
            )

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


class _ResponseError(Exception):
    """The endpoint answered, but not with something the tool can return."""


def _compile_url(template: str) -> list[str | expressions.Template]:
    parts: list[str | expressions.Template] = []
    for index, piece in enumerate(_INTERPOLATION.split(template)):
        if index % 2:
            parts.append(expressions.compile_expression(piece.strip()))
        elif piece:
            parts.append(piece)
    return parts


def _template_host(template: str) -> list[str]:
    """Return the host written in a URL template, or nothing when it is templated."""
    host = urllib.parse.urlsplit(template).hostname or ""
    return [] if ("{" in host or not host) else [host.lower()]


def _host_matches(host: str, allowed: str) -> bool:
    if allowed.startswith("*."):
        return host.endswith(allowed[1:])
    return host == allowed


def _result(response: httpx.Response, body: bytes) -> Any:
    text = body.decode(response.encoding or "utf-8", errors="replace")
    if response.status_code >= 400:
        snippet = text[:_MAX_ERROR_BODY_CHARS]
        raise _ResponseError(f"HTTP {response.status_code} from {response.url.host}: {snippet}")
    try:
        return json.loads(text) if text.strip() else None
    except ValueError:
        return text

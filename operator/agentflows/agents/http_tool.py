"""The ``http`` tool: call an HTTP endpoint with the model's arguments.

Used through :class:`agentflows.agents.tools.SpecToolProvider` (agent tools) and directly by
``tool`` nodes. The URL, headers and body are templates over the scope ``{args}``, evaluated
with the engine's expressions (``{{ .args.city }}`` interpolates, a string starting with ``=``
is a jq program). Values interpolated into the URL are percent-encoded, so an argument can fill
a path segment or a query value but never add a path, a query or a host of its own.

Requests go only to allowed hosts: ``allowHosts`` (``*.example.com`` matches subdomains), or,
when it is empty, the host written in the URL template itself; a template whose host is itself
templated needs ``allowHosts``. The check runs on every request, redirects included (at most
:data:`MAX_REDIRECTS`; secret headers are not sent to another host).

Addresses are checked after DNS resolution, and the connection goes to the address that was
checked (the request is sent to that IP, with the original ``Host`` header and TLS server name),
so a name that resolves differently a moment later (DNS rebinding) cannot slip past the check:

- link-local (``169.254.0.0/16``, ``fe80::/10``), cloud metadata addresses
  (:data:`METADATA_ADDRESSES`), multicast, unspecified and reserved addresses are always refused;
- private, loopback and other non-global addresses (``10/8``, ``127/8``, ``fc00::/7``, CGNAT ...)
  are refused unless the host is named *exactly* — an IP or a name without ``*.`` — in
  ``allowHosts`` (or, when ``allowHosts`` is empty, written literally in the URL template). That
  is how an Agent reaches an in-cluster service (``allowHosts: [search.tools.svc]``) or a local
  test server (``http://127.0.0.1:8080/...``). A wildcard entry never allows a private address.

Because the address is pinned, the tool connects directly: ``HTTP(S)_PROXY`` variables are not
used (a proxy would resolve the name itself, after the check).

Without a ``body`` template, a GET sends the arguments as query parameters (minus those the URL
template already uses) and other methods send them as the JSON body. The response is read up to
``maxResponseBytes``; the result is the parsed JSON, or the text when it is not JSON. A status
of 400 or more is an error for the model, with the start of the body.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import re
import socket
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
#: Redirects followed before the call fails.
MAX_REDIRECTS = 5
#: Cloud metadata endpoints (AWS, ECS, GCP, Azure, Alibaba, Oracle): never reachable.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(address)
    for address in (
        "169.254.169.254",
        "169.254.170.2",
        "fd00:ec2::254",
        "100.100.100.200",
        "192.0.0.192",
    )
)
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


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
        #: Hosts named exactly (no wildcard): the only ones that may resolve to private addresses.
        self._explicit = {_bare(host) for host in self._allowed if not host.startswith("*.")}
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
        except _ResponseError as exc:
            text = self._redactor(f"{self.name}: {exc}")
            return tools.ToolOutcome.failure(text, retryable=exc.retryable)
        except httpx.TransportError as exc:  # refused, reset: the endpoint may be back soon
            text = self._redactor(f"{self.name}: {exc}")
            return tools.ToolOutcome.failure(text, retryable=True)
        except (httpx.HTTPError, expressions.ExpressionError) as exc:
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

        return await self._send(url, request, set(self.spec.secret_headers))

    async def _send(self, url: str, request: dict[str, Any], secret_headers: set[str]) -> Any:
        """Send to the pinned, checked address; follow redirects one checked hop at a time."""
        method = self.spec.method
        origin = urllib.parse.urlsplit(url).hostname
        async with httpx.AsyncClient(
            timeout=self.spec.timeout_seconds, follow_redirects=False, trust_env=False
        ) as client:
            for _ in range(MAX_REDIRECTS + 1):
                self._check_host(url)
                target = await self._pinned(url)
                headers = dict(request.get("headers") or {})
                if urllib.parse.urlsplit(url).hostname != origin:
                    headers = {k: v for k, v in headers.items() if k not in secret_headers}
                sent = client.build_request(
                    method,
                    target.url,
                    **{**request, "headers": {**headers, "Host": target.host_header}},
                    extensions={"sni_hostname": target.host} if target.tls else {},
                )
                response = await client.send(sent, stream=True)
                try:
                    if response.is_redirect and "location" in response.headers:
                        url = urllib.parse.urljoin(url, response.headers["location"])
                        # The Location is a whole URL: the query is not added to it again.
                        request = {k: v for k, v in request.items() if k != "params"}
                        if response.status_code == 303 or (
                            response.status_code in (301, 302) and method == "POST"
                        ):
                            method = "GET"
                            request = {"headers": request.get("headers")}
                        continue
                    body = await self._read_bounded(response)
                    return _result(response, body, target.host)
                finally:
                    await response.aclose()
        raise _ResponseError(f"more than {MAX_REDIRECTS} redirects")

    async def _pinned(self, url: str) -> _Target:
        """Resolve the URL's host, refuse forbidden addresses, and pin the connection to one."""
        parsed = urllib.parse.urlsplit(url)
        host = (parsed.hostname or "").lower()
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        explicit = host in self._explicit
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM
            )
        except OSError as exc:
            raise _ResponseError(f"cannot resolve {host!r}: {exc}") from None
        addresses = list(dict.fromkeys(_address(str(info[4][0])) for info in infos))
        for address in addresses:
            refusal = address_refusal(address, explicit=explicit)
            if refusal is not None:
                raise HostNotAllowed(f"{self.name}: host {host!r} resolves to {address}, {refusal}")
        if not addresses:
            raise _ResponseError(f"cannot resolve {host!r}: no address")
        pinned = str(addresses[0])
        netloc = f"[{pinned}]" if ":" in pinned else pinned
        if parsed.port:
            netloc += f":{parsed.port}"
        return _Target(
            url=urllib.parse.urlunsplit(parsed._replace(netloc=netloc)),
            host=host,
            host_header=parsed.netloc.rpartition("@")[2],
            tls=parsed.scheme == "https",
        )

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

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        #: The endpoint said "later" (429 or 5xx): the same call may succeed then.
        self.retryable = retryable


class _Target:
    """Where one request goes: the URL with the pinned IP, and the names TLS and HTTP need."""

    def __init__(self, url: str, host: str, host_header: str, tls: bool) -> None:
        self.url = url
        self.host = host
        self.host_header = host_header
        self.tls = tls


def address_refusal(address: IpAddress, *, explicit: bool) -> str | None:
    """Why the tool may not connect to ``address`` (None when it may); see module docstring."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address in METADATA_ADDRESSES or address.is_link_local:
        return "a link-local or cloud metadata address, which the http tool never calls"
    if address.is_multicast or address.is_unspecified or address.is_reserved:
        return "a multicast, unspecified or reserved address, which the http tool never calls"
    if not address.is_global and not explicit:
        return (
            "a private or loopback address; name the host exactly in allowHosts to allow it "
            "(wildcards never allow private addresses)"
        )
    return None


def _address(text: str) -> IpAddress:
    return ipaddress.ip_address(text.split("%", 1)[0])


def _bare(host: str) -> str:
    """A host as urlsplit reports it (IPv6 without brackets, lower case)."""
    return host.strip("[]").lower()


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
    return host == _bare(allowed)


def _result(response: httpx.Response, body: bytes, host: str) -> Any:
    text = body.decode(response.encoding or "utf-8", errors="replace")
    if response.status_code >= 400:
        snippet = text[:_MAX_ERROR_BODY_CHARS]
        raise _ResponseError(
            f"HTTP {response.status_code} from {host}: {snippet}",
            retryable=response.status_code == 429 or response.status_code >= 500,
        )
    try:
        return json.loads(text) if text.strip() else None
    except ValueError:
        return text

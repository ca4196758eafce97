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

Every address, whether written literally or resolved from a name, is classified by one function,
:func:`classify`, into an :class:`AddressClass`. IPv6 forms that carry an IPv4 address
(IPv4-mapped ``::ffff:a.b.c.d``, IPv4-compatible ``::a.b.c.d``, 6to4 ``2002::/16``, NAT64
``64:ff9b::/96``, Teredo ``2001::/32``) are classified by the IPv4 address they reach.

- link-local (``169.254.0.0/16``, ``fe80::/10``), cloud metadata addresses
  (:data:`METADATA_ADDRESSES`), multicast, unspecified (``0.0.0.0/8``, ``::``) and reserved
  addresses are always refused (:data:`NEVER_CALLED`);
- loopback (``127/8``, ``::1``), private and other non-global addresses (``10/8``, CGNAT ...),
  site-local ``fec0::/10`` and unique-local ``fc00::/7`` are refused unless the host is named
  *exactly* — an IP or a name without ``*.`` — in ``allowHosts`` (or, when ``allowHosts`` is
  empty, written literally in the URL template). That is how an Agent reaches an in-cluster
  service (``allowHosts: [search.tools.svc]``) or a local test server
  (``http://127.0.0.1:8080/...``, ``http://[::1]:8080/...``). A wildcard entry never allows
  them. IP literals are compared in canonical form (``[0:0::1]`` names ``::1``).

A URL whose port is not a number from 1 to 65535 (say, filled in from the model's arguments) is
an error for the model, like any other unusable URL.

Because the address is pinned, the tool connects directly: ``HTTP(S)_PROXY`` variables are not
used (a proxy would resolve the name itself, after the check).

Without a ``body`` template, a GET sends the arguments as query parameters (minus those the URL
template already uses) and other methods send them as the JSON body. The response is read up to
``maxResponseBytes``; the result is the parsed JSON, or the text when it is not JSON. A status
of 400 or more is an error for the model, with the start of the body.
"""

from __future__ import annotations

import asyncio
import enum
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
#: IPv6 prefixes whose addresses carry an IPv4 address in their last 32 bits.
_IPV4_IN_LAST_32_BITS = (
    ipaddress.ip_network("64:ff9b::/96"),  # NAT64 (RFC 6052)
    ipaddress.ip_network("::/96"),  # IPv4-compatible (deprecated, RFC 4291)
)
_UNIQUE_LOCAL = ipaddress.ip_network("fc00::/7")
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")


class AddressClass(enum.Enum):
    """What an address is, for the http tool's guard; the value names it in messages."""

    PUBLIC = "a public address"
    LOOPBACK = "a loopback address"
    PRIVATE = "a private address"
    SITE_LOCAL = "a site-local address"
    UNIQUE_LOCAL = "a unique-local address"
    LINK_LOCAL = "a link-local address"
    METADATA = "a cloud metadata address"
    MULTICAST = "a multicast address"
    UNSPECIFIED = "an unspecified address"
    RESERVED = "a reserved address"


#: Never called, whatever allowHosts says.
NEVER_CALLED = frozenset(
    {
        AddressClass.LINK_LOCAL,
        AddressClass.METADATA,
        AddressClass.MULTICAST,
        AddressClass.UNSPECIFIED,
        AddressClass.RESERVED,
    }
)


class HostNotAllowed(Exception):
    """A request (or a redirect) would go to a host the tool may not reach."""


class InvalidUrl(Exception):
    """A URL (a rendered template, a redirect) that names no usable scheme, host or port."""


class FetchError(Exception):
    """A file could not be fetched (:meth:`HttpToolRunner.fetch`); the message says why."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        #: A timeout, a lost connection, a 429 or 5xx: fetching again later may work.
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
        self._allowed = [host.lower() for host in spec.allow_hosts] or _template_host(spec.url)
        #: Hosts named exactly (no wildcard): the only ones that may resolve to private addresses.
        self._explicit = {canonical_host(h) for h in self._allowed if not h.startswith("*.")}
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
        except (HostNotAllowed, InvalidUrl) as exc:
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
            self._check_host(url)
            return await asyncio.wait_for(
                self._send(url, {"headers": {}}, set(), raw=True), self.spec.timeout_seconds
            )
        except (TimeoutError, httpx.TimeoutException):
            message, retryable = f"no response within {self.spec.timeout_seconds:g} s", True
        except _ResponseError as exc:
            message, retryable = str(exc), exc.retryable
        except httpx.TransportError as exc:
            message, retryable = str(exc), True
        except (HostNotAllowed, InvalidUrl, httpx.HTTPError) as exc:
            message, retryable = str(exc), False
        raise FetchError(self._redactor(f"{self.name}: {message}"), retryable=retryable)

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

    async def _send(
        self, url: str, request: dict[str, Any], secret_headers: set[str], *, raw: bool = False
    ) -> Any:
        """Send to the pinned, checked address; follow redirects one checked hop at a time.

        The result is the parsed body, or with ``raw`` its bytes (a status of 400 or more is
        an error either way).
        """
        method = self.spec.method
        origin = parse_url(url)[1]
        async with httpx.AsyncClient(
            timeout=self.spec.timeout_seconds, follow_redirects=False, trust_env=False
        ) as client:
            for _ in range(MAX_REDIRECTS + 1):
                self._check_host(url)
                target = await self._pinned(url)
                headers = dict(request.get("headers") or {})
                if parse_url(url)[1] != origin:
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
                    if raw:
                        _check_status(response, body, target.host)
                        return body
                    return _result(response, body, target.host)
                finally:
                    await response.aclose()
        raise _ResponseError(f"more than {MAX_REDIRECTS} redirects")

    async def _pinned(self, url: str) -> _Target:
        """Resolve the URL's host, refuse forbidden addresses, and pin the connection to one."""
        parsed, host, port = parse_url(url)
        addresses = await resolve_allowed(host, port, explicit=host in self._explicit)
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
        _, host, _ = parse_url(url)
        if not any(_host_matches(host, allowed) for allowed in self._allowed):
            allowed = ", ".join(self._allowed) or "none (the URL template's host is templated)"
            raise HostNotAllowed(f"host {host!r} is not allowed (allowHosts: {allowed})")

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


def parse_url(url: str) -> tuple[urllib.parse.SplitResult, str, int]:
    """Split an http(s) URL: the parts, the canonical host and the port (default by scheme).

    Raises :class:`InvalidUrl` for another scheme, no host, or a port that is not a number from
    1 to 65535.
    """
    try:
        parsed = urllib.parse.urlsplit(url)
        host = parsed.hostname
    except ValueError as exc:
        raise InvalidUrl(f"{url!r} is not a valid URL: {exc}") from None
    if parsed.scheme not in ("http", "https") or not host:
        raise InvalidUrl(f"{url!r} is not an http(s) URL with a host")
    try:
        port = parsed.port
    except ValueError:
        port = 0
    # What follows the host (after any user info and IPv6 brackets) is the port as written.
    _, colon, written = parsed.netloc.rpartition("@")[2].rpartition("]")[2].partition(":")
    if colon and written and not (port and 0 < port < 65536):
        raise InvalidUrl(f"{url!r} has port {written!r}; a port is a number from 1 to 65535")
    return parsed, canonical_host(host), port or (443 if parsed.scheme == "https" else 80)


async def resolve_allowed(host: str, port: int, *, explicit: bool) -> list[IpAddress]:
    """Resolve ``host`` and check every address it has; return them, first to connect to.

    ``explicit``: the host is named exactly where it is allowed (see module docstring). Raises
    :class:`HostNotAllowed` when any address may not be called, and :class:`InvalidUrl` when
    the host does not resolve.
    """
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise InvalidUrl(f"cannot resolve {host!r}: {exc}") from None
    addresses = list(dict.fromkeys(_address(str(info[4][0])) for info in infos))
    for address in addresses:
        refusal = address_refusal(address, explicit=explicit)
        if refusal is not None:
            raise HostNotAllowed(f"host {host!r} resolves to {address}, {refusal}")
    if not addresses:
        raise InvalidUrl(f"cannot resolve {host!r}: no address")
    return addresses


def classify(address: IpAddress) -> tuple[AddressClass, IpAddress]:
    """What ``address`` is, and the address that was classified (an embedded IPv4 one)."""
    if isinstance(address, ipaddress.IPv6Address):
        address = embedded_ipv4(address) or address
    if address in METADATA_ADDRESSES:
        return AddressClass.METADATA, address
    if address.is_unspecified or address in _THIS_NETWORK:
        return AddressClass.UNSPECIFIED, address
    if address.is_loopback:
        return AddressClass.LOOPBACK, address
    if address.is_link_local:
        return AddressClass.LINK_LOCAL, address
    if address.is_multicast:
        return AddressClass.MULTICAST, address
    if isinstance(address, ipaddress.IPv6Address):
        if address.is_site_local:
            return AddressClass.SITE_LOCAL, address
        if address in _UNIQUE_LOCAL:
            return AddressClass.UNIQUE_LOCAL, address
    if address.is_reserved:
        return AddressClass.RESERVED, address
    return (AddressClass.PUBLIC if address.is_global else AddressClass.PRIVATE), address


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one reaches (mapped, compatible, 6to4, NAT64, Teredo), if any."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if int(address) > 1 and any(address in prefix for prefix in _IPV4_IN_LAST_32_BITS):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def address_refusal(address: IpAddress, *, explicit: bool) -> str | None:
    """Why the tool may not connect to ``address`` (None when it may); see module docstring."""
    kind, reached = classify(address)
    what = kind.value + (f" ({reached})" if reached != address else "")
    if kind in NEVER_CALLED:
        return f"{what}, which is never called"
    if kind is not AddressClass.PUBLIC and not explicit:
        return (
            f"{what}; name the host exactly in allowHosts to allow it "
            "(wildcards never allow non-public addresses)"
        )
    return None


def canonical_host(host: str) -> str:
    """A host as compared with allowHosts: lower case, IPv6 without brackets, IPs canonical."""
    bare = host.strip("[]").lower()
    try:
        return str(ipaddress.ip_address(bare))
    except ValueError:
        return bare


def _address(text: str) -> IpAddress:
    return ipaddress.ip_address(text.split("%", 1)[0])


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
    try:
        host = urllib.parse.urlsplit(template).hostname or ""
    except ValueError:
        return []
    return [] if ("{" in host or not host) else [host.lower()]


def _host_matches(host: str, allowed: str) -> bool:
    if allowed.startswith("*."):
        return host.endswith(allowed[1:])
    return host == canonical_host(allowed)


def _check_status(response: httpx.Response, body: bytes, host: str) -> None:
    """Raise _ResponseError for a status of 400 or more, quoting the start of the body."""
    if response.status_code >= 400:
        text = body[: _MAX_ERROR_BODY_CHARS * 4].decode(
            response.encoding or "utf-8", errors="replace"
        )
        raise _ResponseError(
            f"HTTP {response.status_code} from {host}: {text[:_MAX_ERROR_BODY_CHARS]}",
            retryable=response.status_code == 429 or response.status_code >= 500,
        )


def _result(response: httpx.Response, body: bytes, host: str) -> Any:
    _check_status(response, body, host)
    text = body.decode(response.encoding or "utf-8", errors="replace")
    try:
        return json.loads(text) if text.strip() else None
    except ValueError:
        return text

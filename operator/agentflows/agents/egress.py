"""The one address guard for every URL a Flow or an Agent names.

Callers: the http tool (:mod:`agentflows.agents.http_tool`, which also fetches reference files
and serves Agent Spec ``RemoteTool``/``ApiNode``), the model client
(:mod:`agentflows.agents.openai_compat`, and :mod:`agentflows.agents.model` before a litellm
call) and MCP servers over HTTP (:mod:`agentflows.agents.mcp`, in the runner and in the
operator's tool discovery). None of them opens a connection any other way.

**Which hosts.** A :class:`Guard` allows the hosts of ``allowHosts`` (``*.example.com`` matches
subdomains) or, when that is empty, the host written in the URL itself (an http tool's URL
template, a model's ``apiBase``, an MCP ``url``). Every hop of a redirect is checked again.

**Which addresses.** Every address a host has — literal, or each one DNS returns — is classified
by :func:`classify` into an :class:`AddressClass`; IPv6 forms that carry an IPv4 address
(IPv4-mapped ``::ffff:a.b.c.d``, IPv4-compatible, 6to4 ``2002::/16``, NAT64 ``64:ff9b::/96``,
Teredo ``2001::/32``) are classified by the IPv4 address they reach.

- link-local (``169.254.0.0/16``, ``fe80::/10``), cloud metadata and host-agent addresses
  (:data:`METADATA_ADDRESSES`, :data:`METADATA_NAMES`), multicast, unspecified and reserved
  addresses are never called (:data:`NEVER_CALLED`);
- loopback, private and other non-global addresses are called only when the host is named
  *exactly* (an IP or a name without ``*.``) in ``allowHosts`` or, without ``allowHosts``,
  written in the URL itself — that is how a local user's ``apiBase: http://127.0.0.1:11434/v1``
  or an in-cluster ``http://vllm.models.svc/v1`` works. A wildcard never allows them, and an
  IPv6 form that wraps a non-public IPv4 address never names it (write ``127.0.0.1``, not
  ``::ffff:127.0.0.1``);
- a host that spells an IPv4 address in another form than four decimal numbers (``0x7f000001``,
  ``2130706433``, ``0177.0.0.1``, ``127.1``) is not a usable URL: resolvers read those as IP
  addresses while allowHosts would compare them as names.

**Connecting to what was checked.** :func:`async_client` builds an httpx (or, for the MCP SDK,
httpx2) client whose connections go through :class:`_GuardedBackend`: the host is resolved
once, every address is classified, and the socket is opened to a checked address (TLS still
verifies the name, and the ``Host`` header is the URL's). A name that resolves differently a
moment later (DNS rebinding) has nothing left to change. Proxies from the environment are not
used (a proxy would resolve the name itself, after the check).

**Credentials across redirects.** :func:`credentials_dropped` removes ``Authorization``,
``Proxy-Authorization``, ``Cookie`` and every header whose value came from a Secret when a
redirect changes the scheme, the host or the port.

Exceptions: :class:`HostNotAllowed` (a host or address the guard refuses) and
:class:`InvalidUrl` (no usable scheme, host or port); neither is worth retrying.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import importlib
import ipaddress
import re
import socket
import ssl
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agentflows.api import errors

#: Cloud metadata and host-agent addresses: AWS IMDS (and its IPv6 form), AWS ECS task
#: metadata, Azure WireServer, Alibaba, Oracle. 169.254.169.254 also serves GCP, Azure IMDS,
#: OpenStack, DigitalOcean and Hetzner.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(address)
    for address in (
        "169.254.169.254",
        "169.254.170.2",
        "169.254.170.23",
        "fd00:ec2::254",
        "fd00:ec2::23",
        "168.63.129.16",
        "100.100.100.200",
        "192.0.0.192",
    )
)
#: Host names of metadata services, refused before any lookup (whatever they resolve to).
METADATA_NAMES = frozenset(
    {
        "metadata.google.internal",
        "metadata.goog",
        "metadata",
        "instance-data",
        "instance-data.ec2.internal",
        "metadata.azure.com",
        "metadata.platformequinix.com",
    }
)
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
#: IPv6 prefixes whose addresses carry an IPv4 address in their last 32 bits.
_IPV4_IN_LAST_32_BITS = (
    ipaddress.ip_network("64:ff9b::/96"),  # NAT64 (RFC 6052)
    ipaddress.ip_network("::/96"),  # IPv4-compatible (deprecated, RFC 4291)
)
_UNIQUE_LOCAL = ipaddress.ip_network("fc00::/7")
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")
#: One label of an IPv4 address as inet_aton reads it: decimal, octal (leading 0) or hex.
_NUMERIC_LABEL = re.compile(r"0x[0-9a-f]*|[0-9]+")
#: Headers that carry credentials whatever their value's origin.
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})


class HostNotAllowed(errors.AgentflowsError):
    """A request (or a redirect) would go to a host or an address the guard refuses."""


class InvalidUrl(errors.AgentflowsError):
    """A URL (a rendered template, a redirect) that names no usable scheme, host or port."""


class AddressClass(enum.Enum):
    """What an address is, for the guard; the value names it in messages."""

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


@dataclasses.dataclass(frozen=True)
class Guard:
    """The hosts one URL-naming field may reach; build it with :meth:`for_url`."""

    #: ``allowHosts`` as written (lower case), or the URL's own host.
    allowed: tuple[str, ...]

    @classmethod
    def for_url(cls, url: str, allow_hosts: Sequence[str] = ()) -> Guard:
        """The guard of ``url``: ``allow_hosts``, or the host written in ``url`` itself.

        A URL whose host is templated (contains ``{``) allows nothing without ``allow_hosts``.
        """
        if allow_hosts:
            return cls(tuple(host.lower() for host in allow_hosts))
        try:
            host = urllib.parse.urlsplit(url).hostname or ""
        except ValueError:
            host = ""
        return cls(() if ("{" in host or not host) else (host.lower(),))

    @property
    def explicit(self) -> frozenset[str]:
        """Hosts named exactly (no wildcard): the only ones that may be non-public."""
        return frozenset(canonical_host(h) for h in self.allowed if not h.startswith("*."))

    def check_host(self, host: str) -> None:
        """Raise :class:`HostNotAllowed` unless ``host`` (canonical) is allowed by name."""
        if host in METADATA_NAMES:
            raise HostNotAllowed(
                f"host {host!r} is a cloud metadata service, which is never called"
            )
        if not any(_host_matches(host, allowed) for allowed in self.allowed):
            allowed = ", ".join(self.allowed) or "none (the URL template's host is templated)"
            raise HostNotAllowed(f"host {host!r} is not allowed (allowHosts: {allowed})")

    def check_url(self, url: str) -> tuple[str, int]:
        """Parse ``url`` and check its host by name; return the canonical host and the port."""
        _, host, port = parse_url(url)
        self.check_host(host)
        return host, port

    async def resolve(self, host: str, port: int) -> list[IpAddress]:
        """Check ``host`` by name, resolve it and check every address (:func:`resolve_allowed`)."""
        self.check_host(host)
        return await resolve_allowed(host, port, explicit=host in self.explicit)


def parse_url(url: str) -> tuple[urllib.parse.SplitResult, str, int]:
    """Split an http(s) URL: the parts, the canonical host and the port (default by scheme).

    Raises :class:`InvalidUrl` for another scheme, no host, a host that spells an IPv4 address
    in another form than four decimal numbers, or a port that is not a number from 1 to 65535.
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
    canonical = canonical_host(host)
    _refuse_numeric_spelling(url, canonical)
    return parsed, canonical, port or (443 if parsed.scheme == "https" else 80)


def _refuse_numeric_spelling(url: str, host: str) -> None:
    """Refuse a host that resolvers read as an IPv4 address but is not written as one."""
    labels = host.removesuffix(".").split(".")
    if not all(_NUMERIC_LABEL.fullmatch(label) for label in labels):
        return
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        pass
    else:
        return
    try:
        meant = f" (it reads as {socket.inet_ntoa(socket.inet_aton(host.removesuffix('.')))})"
    except OSError:
        meant = ""
    raise InvalidUrl(
        f"{url!r} has host {host!r}{meant}: write an IPv4 address as four decimal numbers "
        "(a.b.c.d), without leading zeros"
    )


async def resolve_allowed(host: str, port: int, *, explicit: bool) -> list[IpAddress]:
    """Resolve ``host`` and check every address it has; return them, in the resolver's order.

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
    """Why the guard may not connect to ``address`` (None when it may); see module docstring."""
    kind, reached = classify(address)
    wrapped = reached != address
    what = kind.value + (f" ({reached})" if wrapped else "")
    if kind in NEVER_CALLED:
        return f"{what}, which is never called"
    if kind is AddressClass.PUBLIC:
        return None
    if wrapped:
        return f"{what}; an IPv6 form never names it: write {reached}"
    if not explicit:
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


def same_origin(first: str, second: str) -> bool:
    """Whether two URLs have the same scheme, host and port (default ports filled in)."""
    one, host_one, port_one = parse_url(first)
    two, host_two, port_two = parse_url(second)
    return (one.scheme, host_one, port_one) == (two.scheme, host_two, port_two)


def credentials_dropped(headers: Mapping[str, str], secret_names: Iterable[str]) -> dict[str, str]:
    """``headers`` without credentials: the :data:`CREDENTIAL_HEADERS` and ``secret_names``."""
    dropped = CREDENTIAL_HEADERS | {name.lower() for name in secret_names}
    return {key: value for key, value in headers.items() if key.lower() not in dropped}


def async_client(guard: Guard, *, timeout: Any, flavour: str = "httpx", **kwargs: Any) -> Any:
    """An httpx ``AsyncClient`` that connects only through ``guard`` (see module docstring).

    ``flavour="httpx2"`` builds an httpx2 one (the MCP SDK's). Redirects are not followed.

    ``kwargs`` go to the client (headers, event_hooks, follow_redirects); ``verify`` is the
    TLS verification (an SSLContext, or True for the default CA bundle).
    """
    httpx_module = importlib.import_module(flavour)
    httpcore_module = importlib.import_module("httpcore" if flavour == "httpx" else "httpcore2")
    verify = kwargs.pop("verify", True)
    transport = httpx_module.AsyncHTTPTransport(verify=verify, trust_env=False)
    # The transport's pool, rebuilt with our network backend: httpx has no argument for it.
    transport._pool = httpcore_module.AsyncConnectionPool(
        ssl_context=verify if isinstance(verify, ssl.SSLContext) else None,
        network_backend=_GuardedBackend(guard, httpcore_module.AnyIOBackend()),
    )
    return httpx_module.AsyncClient(transport=transport, timeout=timeout, trust_env=False, **kwargs)


class _GuardedBackend:
    """An httpcore network backend that connects only to addresses :class:`Guard` allows."""

    def __init__(self, guard: Guard, inner: Any) -> None:
        self._guard = guard
        self._inner = inner

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109  (httpcore's backend protocol)
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> Any:
        """Resolve ``host`` once, check every address, and connect to the first that answers."""
        canonical = canonical_host(host)
        _refuse_numeric_spelling(f"{host}:{port}", canonical)
        addresses = await self._guard.resolve(canonical, port)
        error: Exception | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    str(address), port, timeout, local_address, socket_options
                )
            except Exception as exc:  # httpcore's ConnectError/ConnectTimeout: try the next
                error = exc
        assert error is not None
        raise error

    async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> Any:
        """Never used: the guard's clients speak TCP only."""
        raise HostNotAllowed("unix sockets are not reachable through a URL")

    async def sleep(self, seconds: float) -> None:
        """Delegate to the inner backend (httpcore's retries use it)."""
        await self._inner.sleep(seconds)


def _address(text: str) -> IpAddress:
    return ipaddress.ip_address(text.split("%", 1)[0])


def _host_matches(host: str, allowed: str) -> bool:
    if allowed.startswith("*."):
        return host.endswith(allowed[1:])
    return host == canonical_host(allowed)

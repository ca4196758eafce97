"""Security headers on every answer, and CSRF protection of every state-changing request.

CSRF: a form carries ``csrf``, an HMAC of the signed-in identity's key (:meth:`Identity.key`)
under a secret made when the console starts. A POST without the token of *its* identity is
refused (403) before any API call, so another site cannot make a signed-in browser decide,
cancel or start anything; a restart invalidates open forms (the page says to reload). The
``Origin`` header, when the browser sends one, must be this console's own.

Host (DNS rebinding): a console that acts as the user running it (``--local``, or on a cluster
as the kubeconfig's user) listens on loopback, and answers only requests that name it by a
loopback name — ``localhost``, ``127.0.0.1``, ``[::1]`` or the address it is bound to — with
its own port (:func:`loopback_only`). A page of another site whose name was re-pointed at
127.0.0.1 sends its own name as ``Host`` and gets 421 before any page (and CSRF token) is
made; a POST whose ``Origin`` is not such a name is 403.

Content-Security-Policy: ``default-src 'none'`` and only this console's own script, styles and
images (``'self'``): no inline script or handler runs even if markup were injected, and nothing
is fetched from elsewhere. Pages are not framed (clickjacking) and not sniffed.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable
from urllib import parse

from aiohttp import web

from agentflows.console import identity as identity_mod

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Csrf:
    """Tokens bound to an identity, checked on every POST."""

    def __init__(self) -> None:
        self._secret = secrets.token_bytes(32)

    def token(self, who: identity_mod.Identity) -> str:
        """The token the forms of ``who`` carry."""
        return hmac.new(self._secret, who.key().encode(), hashlib.sha256).hexdigest()

    def check(self, who: identity_mod.Identity, given: str) -> None:
        """403 unless ``given`` is the token of ``who``."""
        if not hmac.compare_digest(self.token(who), given or ""):
            raise web.HTTPForbidden(
                text="this form is stale or came from another site: reload the page and try again"
            )


def same_origin(request: web.Request) -> bool:
    """True when the browser sent no ``Origin`` or this console's own."""
    origin = request.headers.get("Origin")
    return not origin or parse.urlsplit(origin).netloc == request.host


#: The names a loopback console answers to, besides the address it is bound to.
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})


def _bound(request: web.Request) -> tuple[str, int] | None:
    """The address (as it appears in a URL) and port the request came in on."""
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    if not sockname:
        return None
    host = str(sockname[0])
    return (f"[{host}]" if ":" in host else host), int(sockname[1])


def _is_own(netloc: str, bound: tuple[str, int]) -> bool:
    """Whether ``netloc`` (``host[:port]``) names this console by a loopback name and its port."""
    try:
        parts = parse.urlsplit(f"//{netloc}")
        port = parts.port
    except ValueError:
        return False
    host = parts.netloc.rsplit(":", 1)[0] if port is not None else parts.netloc
    address, own_port = bound
    return host.lower() in LOOPBACK_NAMES | {address} and (port or 80) == own_port


@web.middleware
async def loopback_only(request: web.Request, handler: Handler) -> web.StreamResponse:
    """421 for a ``Host`` that is not this console's loopback name; 403 for such an Origin."""
    bound = _bound(request)
    if bound is not None:
        address, port = bound
        if not _is_own(request.host, bound):
            raise web.HTTPMisdirectedRequest(
                text=f"this console answers only as http://127.0.0.1:{port}/ (or localhost, "
                f"[::1], {address}), not as {request.host!r}: a page of another site cannot "
                "reach it through a name of its own (DNS rebinding)"
            )
        origin = request.headers.get("Origin")
        if request.method not in ("GET", "HEAD") and origin is not None:
            parts = parse.urlsplit(origin)
            if parts.scheme != "http" or not _is_own(parts.netloc, bound):
                raise web.HTTPForbidden(
                    text=f"cross-site request refused: Origin {origin!r} is not this console"
                )
    return await handler(request)


@web.middleware
async def origin_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A state-changing request from another site's page is refused before anything runs."""
    if request.method not in ("GET", "HEAD") and not same_origin(request):
        raise web.HTTPForbidden(text="cross-site request refused")
    return await handler(request)


async def add_headers(request: web.Request, response: web.StreamResponse) -> None:
    """The security headers, on every answer (errors and event streams too)."""
    response.headers.update(HEADERS)

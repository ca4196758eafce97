"""What every page handler shares: the console's parts, the caller, the page answer.

:class:`Console` is kept in the aiohttp application under :data:`KEY`. :func:`caller` resolves
the request's identity once (401 before any page work when there is none). A refusal from the
API server (:class:`agentflows.kube.client.ApiError`) becomes a page that shows the server's
own message with its status, by :func:`api_errors` — so a user sees exactly why RBAC or the
approvers' policy said no.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Awaitable, Callable

from aiohttp import typedefs, web

from agentflows.console import identity, live, markup, security
from agentflows.kube import client as kube


@dataclasses.dataclass
class Console:
    """The console's parts, made once at start."""

    csrf: security.Csrf
    #: Namespace shown when the page names none (the kubeconfig's or ``--namespace``).
    namespace: str
    #: How callers are identified and acted for (None: ``--local``, no API server).
    gate: identity.Gate | None = None
    hub: live.Hub | None = None
    #: Where the webhook receiver is reached (``--webhook-url``; empty: show paths only).
    webhook_url: str = ""
    #: Namespaces to look in for a user who may not list runs cluster-wide (``--namespace``).
    namespaces: tuple[str, ...] = ()


KEY = web.AppKey("console", Console)
_CALLER = web.RequestKey("caller", identity.Identity)


def of(request: web.Request) -> Console:
    """The console serving ``request``."""
    return request.app[KEY]


def caller(request: web.Request) -> identity.Identity:
    """Who sent ``request`` (resolved once per request; locally, the user running it)."""
    if _CALLER not in request:
        gate = of(request).gate
        request[_CALLER] = gate.identify(request) if gate else identity.Identity()
    return request[_CALLER]


def api(request: web.Request) -> contextlib.AbstractAsyncContextManager[kube.Client]:
    """An API client acting as the caller."""
    gate = of(request).gate
    if gate is None:
        raise web.HTTPNotFound(text="no cluster: this console shows local runs")
    return gate.client(caller(request))


def hub(request: web.Request) -> live.Hub:
    """The live feeds."""
    found = of(request).hub
    if found is None:
        raise web.HTTPNotFound(text="no cluster: this console shows local runs")
    return found


def page(
    request: web.Request,
    title: str,
    body: markup.Html,
    *,
    live_path: str | None = None,
    status: int = 200,
) -> web.Response:
    """An HTML page for the caller."""
    user = caller(request).shown() if of(request).gate is not None else "local runs"
    text = markup.page(title, body, user=user, live=live_path)
    return web.Response(text=text, status=status, content_type="text/html", charset="utf-8")


async def check_csrf(request: web.Request) -> dict[str, str]:
    """The POSTed form, once its CSRF token is the caller's (403 otherwise)."""
    form = await request.post()
    fields = {k: v for k, v in form.items() if isinstance(v, str)}
    of(request).csrf.check(caller(request), fields.get("csrf", ""))
    return fields


def csrf(request: web.Request) -> str:
    """The caller's CSRF token, for forms."""
    return of(request).csrf.token(caller(request))


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: Why a name in a URL is not a valid run (or namespace) name; None when it is.
NameCheck = Callable[[str], "str | None"]
#: The parts of a route that name an object: never a path, whatever the route.
NAME_PARTS = ("namespace", "name")


def names_only(name_problem: NameCheck) -> typedefs.Middleware:
    """A middleware answering 404 when a route's namespace or run name is not a name.

    The one check of every route of the console (cluster and local): aiohttp decodes ``%2f``
    into the match, so ``/local/..%2fother%2frun`` would otherwise name a path.
    """

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        for part in NAME_PARTS:
            value = request.match_info.get(part)
            problem = name_problem(value) if value is not None else None
            if problem is not None:
                raise web.HTTPNotFound(text=f"no such {part}: {problem}")
        return await handler(request)

    return check


@web.middleware
async def api_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The API server's refusal as a page with its message (4xx as is, else 502)."""
    try:
        return await handler(request)
    except kube.ApiError as exc:
        status = exc.status if 400 <= exc.status < 500 else 502
        what = f"The API server refused: {exc.message}" if exc.status else exc.message
        body = markup.join([markup.notice(what, error=True), markup.link("/runs", "Back to runs")])
        return page(request, "Refused" if exc.status else "Unreachable", body, status=status)

"""Who is asking: every API call the console makes is made as that user, never as itself.

Three ways, chosen when the console starts (:class:`Gate`):

- Behind an authenticating proxy (``--trust-proxy-from CIDR``): the proxy's
  ``X-Forwarded-User`` and ``X-Forwarded-Groups`` (comma-separated, as oauth2-proxy sends
  them) are believed only on connections from that network; the console calls the API server
  with ``Impersonate-User``/``Impersonate-Group`` headers on its own client, whose credentials
  may impersonate and nothing more. A request from anywhere else is refused (401): a header
  anyone can write is not an identity. A forwarded user or group in Kubernetes' reserved
  ``system:`` namespace (``system:masters``, ``system:serviceaccount:...``, ``system:node:...``)
  is refused (403) unless ``--allow-system-identity`` names it: those are the cluster's own
  components (the operator, whom the decision policy trusts; the nodes; the superusers), never
  a person a proxy signs in, and a proxy that forwards one is misconfigured or forged.
- With ``--pass-tokens``: a request's ``Authorization: Bearer`` token is passed to the API
  server on a client that holds no credentials of the console's own (no client certificate
  either: the API server would authenticate that first).
- Otherwise (a laptop): the kubeconfig's identity, the console being that user's own program;
  it listens on loopback unless told otherwise.

So the API server's RBAC and the approvers' admission policy decide, and ``decidedBy`` is the
person. :meth:`Identity.key` names an identity without its secret, to share watches and to
bind CSRF tokens.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import ipaddress
import logging
from collections.abc import AsyncIterator, Iterable

from aiohttp import web

from agentflows.kube import client as kube

FORWARDED_USER = "X-Forwarded-User"
FORWARDED_GROUPS = "X-Forwarded-Groups"
#: Longest forwarded user or group name taken (a Kubernetes user name has no set limit).
MAX_NAME = 253
#: Kubernetes reserves this prefix for its own users, groups and service accounts.
SYSTEM_PREFIX = "system:"
#: How many refused names are remembered so that each is logged once.
MAX_LOGGED = 1024

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Identity:
    """The signed-in user: impersonated (``user``), a passed token, or the kubeconfig's."""

    user: str | None = None
    groups: tuple[str, ...] = ()
    token: str | None = dataclasses.field(default=None, repr=False)

    def key(self) -> str:
        """A name for this identity that holds no secret (a token's SHA-256 prefix)."""
        if self.token is not None:
            return "token:" + hashlib.sha256(self.token.encode()).hexdigest()[:32]
        if self.user is not None:
            return "user:" + self.user + "|" + ",".join(self.groups)
        return "kubeconfig"

    def shown(self) -> str:
        """What the page header shows."""
        if self.user is not None:
            return self.user
        return "your token" if self.token is not None else "kubeconfig user"


class Gate:
    """Turns a web request into an :class:`Identity`, and an identity into an API client."""

    def __init__(
        self,
        api: kube.Client,
        *,
        trusted_proxy: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None,
        pass_tokens: bool = False,
        allowed_system: Iterable[str] = (),
    ) -> None:
        self.api = api
        self.trusted_proxy = trusted_proxy
        self.pass_tokens = pass_tokens
        self.allowed_system = frozenset(allowed_system)
        self._logged: set[str] = set()

    @property
    def local(self) -> bool:
        """True when the console acts with the kubeconfig's identity."""
        return self.trusted_proxy is None and not self.pass_tokens

    def identify(self, request: web.Request) -> Identity:
        """The caller; 401 when the console is configured for users and none is known."""
        if self.local:
            return Identity()
        forwarded = request.headers.get(FORWARDED_USER, "").strip()
        if self.trusted_proxy is not None and forwarded and self._from_proxy(request):
            groups = request.headers.get(FORWARDED_GROUPS, "")
            vouched = Identity(
                user=forwarded[:MAX_NAME],
                groups=tuple(g.strip()[:MAX_NAME] for g in groups.split(",") if g.strip()),
            )
            self._refuse_system(vouched)
            return vouched
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if self.pass_tokens and scheme.lower() == "bearer" and token.strip():
            return Identity(token=token.strip())
        raise web.HTTPUnauthorized(
            text="sign in: this console acts only for a user its proxy vouches for"
            + (" or who sends a bearer token" if self.pass_tokens else "")
        )

    def _refuse_system(self, vouched: Identity) -> None:
        """403 when the proxy vouches for a ``system:`` name the configuration does not allow."""
        names = [("user", vouched.user or "")] + [("group", g) for g in vouched.groups]
        for kind, name in names:
            if not name.startswith(SYSTEM_PREFIX) or name in self.allowed_system:
                continue
            if name not in self._logged and len(self._logged) < MAX_LOGGED:
                self._logged.add(name)
                log.warning(
                    "refused to impersonate the forwarded %s %r: system: identities are "
                    "acted for only when --allow-system-identity names them",
                    kind,
                    name,
                )
            raise web.HTTPForbidden(
                text=f"refused: the proxy forwarded the {kind} {name!r}, a Kubernetes system "
                "identity; this console never acts as one unless its configuration allows it "
                "(--allow-system-identity, chart value console.allowSystemIdentities)"
            )

    def _from_proxy(self, request: web.Request) -> bool:
        peer = request.remote or ""
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return False
        return self.trusted_proxy is not None and address in self.trusted_proxy

    @contextlib.asynccontextmanager
    async def client(self, identity: Identity) -> AsyncIterator[kube.Client]:
        """An API client acting as ``identity`` (closed afterwards when it is its own)."""
        if identity.token is not None:
            config = dataclasses.replace(
                self.api.config,
                token=identity.token,
                token_file=None,
                cert_file=None,
                cert_data=None,
                key_file=None,
                key_data=None,
                library=None,
                exec_credential=None,
            )
            async with kube.Client(config, retry_seconds=5) as own:
                yield own
            return
        if identity.user is not None:
            headers = [("Impersonate-User", identity.user)]
            headers += [("Impersonate-Group", g) for g in identity.groups]
            yield self.api.acting_as(headers)
            return
        yield self.api

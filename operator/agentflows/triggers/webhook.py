"""``agentflows webhook``: the receiver that turns signed POSTs into FlowRuns.

``POST /hooks/{namespace}/{flow}/{trigger}``, signed with the key in the Secret the trigger names
(``X-Hub-Signature-256``, or Standard Webhooks with a signed timestamp: see
:mod:`agentflows.triggers.signing`). Answers, in the order they are checked:

- 413 a body over ``max_body_bytes`` (1 MiB; Content-Length first, then while reading);
- 503 the receiver has not finished listing Flows yet, or its body buffers are full
  (``max_buffered_bytes`` over all requests), or the API server failed (with Retry-After);
- 408 the body did not arrive within ``body_timeout_seconds``;
- 401 no such Flow or trigger, the trigger's Secret is missing, or the signature is missing or
  wrong: one answer, the same status and body, so an outsider learns nothing about which
  triggers exist (the body is read to the end in every case, under the same limits);
- 401 a Standard Webhooks delivery correctly signed but outside ``timestamp_tolerance_seconds``;
- 400 the body is not JSON, or nests deeper than ``max_json_depth``;
- 200 ``{"flowRun", "duplicate": true}`` the sender's delivery id was already run within
  ``dedup_window_seconds`` (a redelivery);
- 409 the same signed content was already accepted within ``replay_window_seconds``, under
  whatever delivery id: a replay of a captured request;
- 429 over the trigger's ``rateLimitPerMinute`` (with Retry-After);
- 422 the trigger's ``input`` expression failed on this body;
- 202 ``{"flowRun": NAME, "namespace": NS}``: the FlowRun was created.

Outsiders cost nothing but their bytes: which triggers exist comes from an in-memory cache of
Flows fed by one list and one watch (:mod:`agentflows.kube.informer`), so no request makes an
API call before its trigger is known; the Secret is read (and cached) only for a known trigger;
the signature is checked before the body is parsed or counted against the rate limit.
Connections are bounded in number (``max_connections``, and ``max_connections_per_peer`` from
one source address, so one client's slow connections cannot take the slots of the others; more
are answered 503 and closed) and in time: request headers must arrive within
``header_timeout_seconds`` (also the idle keep-alive limit) and the body within
``body_timeout_seconds``. ``GET /healthz`` (alive), ``GET /readyz``
(the Flow cache is complete) and ``GET /metrics`` (Prometheus: requests by namespace, flow,
trigger and code, and refused signatures by reason — ``unknown_trigger``, ``missing_secret``,
``bad_signature``, ``stale_timestamp`` — with unknown triggers counted under empty labels so a
scanner cannot grow the series).

The receiver needs list/watch on Flows (cluster-wide, or in each of ``namespaces``), get on the
Secrets its triggers name, and create on FlowRuns. Secrets are cached for
``secret_ttl_seconds``, so a rotated key takes effect within that long. Delivery ids, digests and
rate limits live in memory (one replica, or sticky routing, gives exact de-duplication).

A request's W3C ``traceparent`` header becomes the parent of the run it starts: the receiver
stores it (or, when it traces itself, its own request span's) in the FlowRun's
``agentflows.io/traceparent`` annotation (:mod:`agentflows.tracing`).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import dataclasses
import json
import logging
import signal
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Generic, TypeVar

import prometheus_client
from aiohttp import web, web_server

from agentflows import tracing
from agentflows.api import flow as flow_api
from agentflows.api import wellknown
from agentflows.kube import client as kube
from agentflows.kube import informer
from agentflows.triggers import common, signing

log = logging.getLogger(__name__)

MIB = 1024 * 1024
#: The one answer for an unknown trigger, a missing Secret and a bad signature.
UNAUTHORIZED = "unknown trigger, or a missing or invalid signature"
_BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 5\r\nContent-Length: 0\r\n"
    b"Connection: close\r\n\r\n"
)
_V = TypeVar("_V")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Limits, windows and cache lifetimes of the receiver."""

    max_body_bytes: int = MIB
    #: Body bytes held at once over all requests; beyond it deliveries get 503.
    max_buffered_bytes: int = 32 * MIB
    max_connections: int = 256
    #: Connections one source address may hold at once (behind a proxy that hides the
    #: source, the proxy is that address: raise it, or limit per client at the proxy).
    max_connections_per_peer: int = 32
    header_timeout_seconds: float = 10.0
    body_timeout_seconds: float = 10.0
    max_json_depth: int = 64
    dedup_window_seconds: float = 600.0
    replay_window_seconds: float = 3600.0
    timestamp_tolerance_seconds: float = 300.0
    max_deliveries: int = 100_000
    secret_ttl_seconds: float = 30.0
    max_cached: int = 10_000
    #: Namespaces whose Flows may be triggered (empty: all, which needs a ClusterRole).
    namespaces: tuple[str, ...] = ()


class _TtlCache(Generic[_V]):
    """A bounded map whose entries expire."""

    def __init__(self, ttl: float, max_entries: int, clock: Callable[[], float]) -> None:
        self._ttl = ttl
        self._max = max_entries
        self._clock = clock
        self._entries: collections.OrderedDict[Any, tuple[float, _V]] = collections.OrderedDict()

    def get(self, key: Any) -> tuple[bool, _V | None]:
        entry = self._entries.get(key)
        if entry is None or entry[0] <= self._clock():
            return False, None
        return True, entry[1]

    def put(self, key: Any, value: _V) -> None:
        self._entries.pop(key, None)
        self._entries[key] = (self._clock() + self._ttl, value)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)


@dataclasses.dataclass(frozen=True)
class _Target:
    """What the receiver keeps of a Flow: its identity and its webhook triggers by name."""

    flow: dict[str, Any]
    triggers: dict[str, flow_api.Trigger]


def _target_of(obj: Mapping[str, Any]) -> _Target | None:
    """The cache entry of a Flow object (None: it has no valid webhook trigger)."""
    triggers: dict[str, flow_api.Trigger] = {}
    for raw in (obj.get("spec") or {}).get("triggers") or []:
        try:
            trigger = flow_api.Trigger.model_validate(raw)
        except ValueError:
            continue
        if trigger.webhook is not None:
            triggers[trigger.name] = trigger
    if not triggers:
        return None
    meta = obj.get("metadata") or {}
    identity = {k: meta[k] for k in ("name", "namespace", "uid") if k in meta}
    return _Target({"metadata": identity}, triggers)


class _Reject(Exception):
    """Answer the request with ``status`` and a JSON ``{"error": message}``."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def nests_deeper_than(value: Any, limit: int) -> bool:
    """Whether a parsed JSON value has more than ``limit`` nested arrays/objects (iterative)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def parse_json(body: bytes, max_depth: int) -> Any:
    """The payload; a 400 rejection when it is not JSON or nests deeper than ``max_depth``."""
    try:
        payload = json.loads(body)
    except RecursionError:
        payload = None
        too_deep = True
    except ValueError as exc:
        raise _Reject(400, f"body is not JSON: {exc}") from exc
    else:
        too_deep = nests_deeper_than(payload, max_depth)
    if too_deep:
        raise _Reject(400, f"body nests deeper than {max_depth} arrays/objects")
    return payload


class Receiver:
    """The receiver's state: Flow cache, API client, guards, delivery ids and metrics."""

    def __init__(
        self,
        client: kube.Client,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.settings = settings
        self.limiter = common.RateLimiter(clock=clock)
        self.deliveries = common.Deduplicator(max_keys=settings.max_deliveries, clock=clock)
        scopes = settings.namespaces or ("",)
        self.flows = {
            namespace: informer.Informer(
                client, kube.path_of("flows", namespace or None), _target_of
            )
            for namespace in scopes
        }
        self._secrets: _TtlCache[bytes | None] = _TtlCache(
            settings.secret_ttl_seconds, settings.max_cached, clock
        )
        self._buffered = 0
        self.registry = prometheus_client.CollectorRegistry()
        prometheus_client.Gauge(
            "agentflows_webhook_buffered_bytes",
            "Request body bytes held in memory now, over all deliveries (max_buffered_bytes).",
            registry=self.registry,
        ).set_function(lambda: self._buffered)
        self.requests = prometheus_client.Counter(
            "agentflows_webhook_requests_total",
            "Webhook deliveries by answer code.",
            ["namespace", "flow", "trigger", "code"],
            registry=self.registry,
        )
        self.signature_failures = prometheus_client.Counter(
            "agentflows_webhook_signature_failures_total",
            "Deliveries refused with 401, by reason (unknown_trigger, missing_secret,"
            " bad_signature, stale_timestamp).",
            ["namespace", "flow", "trigger", "reason"],
            registry=self.registry,
        )
        self.duration = prometheus_client.Histogram(
            "agentflows_webhook_request_duration_seconds",
            "Time to answer a webhook delivery.",
            ["code"],
            registry=self.registry,
        )

    @property
    def ready(self) -> bool:
        """True once every Flow cache has completed its first list."""
        return all(cache.ready.is_set() for cache in self.flows.values())

    async def watch_flows(self) -> None:
        """Keep the Flow caches current (runs until cancelled)."""
        await asyncio.gather(*(cache.run() for cache in self.flows.values()))

    def _trigger(self, namespace: str, flow: str, name: str) -> tuple[_Target, Any] | None:
        cache = self.flows.get(namespace if self.settings.namespaces else "")
        target = cache.get(namespace, flow) if cache is not None else None
        trigger = target.triggers.get(name) if target is not None else None
        return (target, trigger) if target is not None and trigger is not None else None

    async def _secret(self, namespace: str, ref: Any) -> bytes | None:
        key = (namespace, ref.name, ref.key)
        found, cached = self._secrets.get(key)
        if found:
            return cached
        value: bytes | None = None
        try:
            secret = await self.client.get(kube.path_of("secrets", namespace, ref.name))
            encoded = (secret.get("data") or {}).get(ref.key)
            value = base64.b64decode(encoded) if encoded else None
        except kube.ApiError as exc:
            if exc.retryable:
                raise
            log.warning("webhook secret %s/%s: %s", namespace, ref.name, exc.reason)
        self._secrets.put(key, value)
        return value

    async def _read_body(self, request: web.Request, keep: bool) -> tuple[bytes, int]:
        """The body (empty unless ``keep``) and the bytes reserved for it, which the caller frees.

        Reads to the end whether or not the body is kept, under one deadline, one size limit
        and one shared budget, so a known and an unknown trigger cannot be told apart.
        """
        limit = self.settings.max_body_bytes
        chunks: list[bytes] = []
        size = reserved = 0
        try:
            async with asyncio.timeout(self.settings.body_timeout_seconds):
                while chunk := await request.content.read(65_536):
                    size += len(chunk)
                    if size > limit:
                        raise _Reject(413, f"body over {limit} bytes")
                    if self._buffered + len(chunk) > self.settings.max_buffered_bytes:
                        raise _Reject(503, "too many deliveries at once", {"Retry-After": "5"})
                    self._buffered += len(chunk)
                    reserved += len(chunk)
                    if keep:
                        chunks.append(chunk)
        except TimeoutError as exc:
            self._buffered -= reserved
            seconds = self.settings.body_timeout_seconds
            raise _Reject(408, f"the body did not arrive within {seconds:.0f} s") from exc
        except BaseException:
            self._buffered -= reserved
            raise
        return b"".join(chunks), reserved

    async def deliver(
        self,
        request: web.Request,
        namespace: str,
        flow: str,
        name: str,
        traceparent: str | None = None,
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        """Check one delivery and create its FlowRun; return (status, JSON answer, headers).

        ``traceparent`` is stored on the FlowRun, so the run's trace continues it.
        """
        limit = self.settings.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise _Reject(413, f"body over {limit} bytes")
        if not self.ready:
            raise _Reject(503, "the receiver is starting", {"Retry-After": "5"})
        known = self._trigger(namespace, flow, name)
        body, reserved = await self._read_body(request, keep=known is not None)
        try:
            if known is None:
                self.signature_failures.labels("", "", "", "unknown_trigger").inc()
                raise _Reject(401, UNAUTHORIZED)
            target, trigger = known
            signed = await self._verify(namespace, flow, trigger, body, request)
            payload = parse_json(body, self.settings.max_json_depth)
            return await self._admit(target, trigger, payload, signed, traceparent)
        finally:
            self._buffered -= reserved

    async def _verify(
        self,
        namespace: str,
        flow: str,
        trigger: flow_api.Trigger,
        body: bytes,
        request: web.Request,
    ) -> signing.Signed:
        assert trigger.webhook is not None
        secret = await self._secret(namespace, trigger.webhook.secret)
        signed: signing.Signed | None = None
        reason = "bad_signature"
        if secret is None:
            log.warning("the Secret of webhook trigger %s/%s is missing", namespace, trigger.name)
            reason = "missing_secret"
        else:
            tolerance = self.settings.timestamp_tolerance_seconds
            try:
                signed = signing.verify(secret, body, request.headers, time.time(), tolerance)
            except signing.StaleTimestamp as exc:
                self.signature_failures.labels(
                    namespace, flow, trigger.name, "stale_timestamp"
                ).inc()
                raise _Reject(401, str(exc)) from exc
        if signed is None:
            self.signature_failures.labels(namespace, flow, trigger.name, reason).inc()
            raise _Reject(401, UNAUTHORIZED)
        return signed

    async def _admit(
        self,
        target: _Target,
        trigger: flow_api.Trigger,
        payload: Any,
        signed: signing.Signed,
        traceparent: str | None,
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        """Refuse redeliveries and replays, then create the run; a failure frees both claims."""
        meta = target.flow["metadata"]
        scope = f"{meta['namespace']}/{meta['name']}/{trigger.name}"
        delivery_key = f"{scope}/delivery/{signed.delivery}" if signed.delivery else ""
        if delivery_key:
            previous = self.deliveries.claim(delivery_key, self.settings.dedup_window_seconds)
            if previous is not None:
                return 200, {"flowRun": previous, "duplicate": True}, {}
        digest_key = f"{scope}/sha256/{signed.digest}"
        claimed = [k for k in (delivery_key,) if k]
        try:
            if self.deliveries.claim(digest_key, self.settings.replay_window_seconds) is not None:
                raise _Reject(409, "this signed delivery was already accepted (a replay)")
            claimed.append(digest_key)
            run_name = await self._create(target, trigger, payload, signed.delivery, traceparent)
        except BaseException:
            for key in claimed:
                self.deliveries.release(key)
            raise
        for key in claimed:
            self.deliveries.settle(key, run_name)
        return 202, {"flowRun": run_name, "namespace": meta["namespace"]}, {}

    async def _create(
        self,
        target: _Target,
        trigger: flow_api.Trigger,
        payload: Any,
        delivery: str,
        traceparent: str | None,
    ) -> str:
        meta = target.flow["metadata"]
        bucket = f"{meta['namespace']}/{meta['name']}/{trigger.name}"
        if not self.limiter.allow(bucket, trigger.rate_limit_per_minute):
            wait = self.limiter.retry_after(bucket, trigger.rate_limit_per_minute)
            raise _Reject(429, "rate limit exceeded", {"Retry-After": str(max(1, round(wait)))})
        annotations = {wellknown.DELIVERY_ANNOTATION: delivery} if delivery else {}
        if traceparent:
            annotations[wellknown.TRACEPARENT_ANNOTATION] = traceparent
        request = common.RunRequest(payload=payload, annotations=annotations)
        try:
            run = await common.create_run(self.client, target.flow, trigger, request)
        except common.TriggerError as exc:
            raise _Reject(422, str(exc)) from exc
        return str(run["metadata"]["name"])

    async def handle_hook(self, request: web.Request) -> web.Response:
        """``POST /hooks/{namespace}/{flow}/{trigger}``."""
        started = time.perf_counter()
        namespace = request.match_info["namespace"]
        flow = request.match_info["flow"]
        name = request.match_info["trigger"]
        try:
            with tracing.request_span(
                f"POST /hooks/{namespace}/{flow}/{name}",
                request.headers.get("traceparent"),
                {"http.request.method": "POST", "url.path": request.path},
            ) as traceparent:
                status, answer, headers = await self.deliver(
                    request, namespace, flow, name, traceparent
                )
        except _Reject as reject:
            status, answer, headers = reject.status, {"error": reject.message}, reject.headers
        except kube.ApiError as exc:
            log.warning("webhook %s/%s/%s: %s", namespace, flow, name, exc)
            status = 503 if exc.retryable else 500
            answer, headers = {"error": f"API server: {exc.reason}"}, {}
        known = self._trigger(namespace, flow, name) is not None
        labels = (namespace, flow, name) if known else ("", "", "")
        self.requests.labels(*labels, str(status)).inc()
        self.duration.labels(str(status)).observe(time.perf_counter() - started)
        return web.json_response(answer, status=status, headers=headers)

    async def handle_healthz(self, request: web.Request) -> web.Response:
        """``GET /healthz``: the process serves requests."""
        return web.json_response({"status": "ok"})

    async def handle_readyz(self, request: web.Request) -> web.Response:
        """``GET /readyz``: 200 once the Flow cache is complete, else 503."""
        if self.ready:
            return web.json_response({"status": "ready"})
        return web.json_response({"status": "listing Flows"}, status=503)

    async def handle_metrics(self, request: web.Request) -> web.Response:
        """``GET /metrics`` in the Prometheus text format."""
        return web.Response(
            body=prometheus_client.generate_latest(self.registry),
            headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST},
        )


RECEIVER = web.AppKey("receiver", Receiver)


def make_app(client: kube.Client, settings: Settings | None = None) -> web.Application:
    """The receiver's aiohttp application (the caller owns and closes ``client``).

    The app watches Flows from its startup to its cleanup.
    """
    settings = settings or Settings()
    receiver = Receiver(client, settings)
    # The hook handler reads the body itself with a cap; this bounds everything else.
    app = web.Application(client_max_size=settings.max_body_bytes + 1)
    app[RECEIVER] = receiver

    async def watching(_: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(receiver.watch_flows(), name="webhook flow watch")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app.cleanup_ctx.append(watching)
    app.router.add_post("/hooks/{namespace}/{flow}/{trigger}", receiver.handle_hook)
    app.router.add_get("/healthz", receiver.handle_healthz)
    app.router.add_get("/readyz", receiver.handle_readyz)
    app.router.add_get("/metrics", receiver.handle_metrics)
    return app


class _Busy(asyncio.Protocol):
    """A connection over ``max_connections``: answered 503 and closed at once."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(_BUSY_RESPONSE)
        transport.close()


class _PeerGate(asyncio.Protocol):
    """Hands a connection to the receiver unless its source holds too many already."""

    def __init__(self, handlers: web_server.Server, limit: int) -> None:
        self.handlers = handlers
        self.limit = limit

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        peer = _host(transport)
        held = sum(
            1
            for handler in self.handlers.connections
            if handler.transport is not None and _host(handler.transport) == peer
        )
        if held >= self.limit:
            transport.write(_BUSY_RESPONSE)
            transport.close()
            return
        handler = self.handlers()
        transport.set_protocol(handler)
        handler.connection_made(transport)


def _host(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else ""


@dataclasses.dataclass
class Listening:
    """A running receiver: its aiohttp runner and listening socket."""

    runner: web.AppRunner
    server: asyncio.Server

    @property
    def port(self) -> int:
        """The bound port."""
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop accepting, then stop the app (which stops its Flow watch)."""
        self.server.close()
        await self.runner.cleanup()


async def listen(app: web.Application, host: str, port: int) -> Listening:
    """Serve ``app`` on host:port with the receiver's connection limits and header timeout."""
    settings = app[RECEIVER].settings
    # keepalive_timeout is also how long aiohttp waits for a request's headers; lingering_time
    # is how long it drains an unread body after answering (10 s by default) before closing.
    runner = web.AppRunner(
        app,
        access_log=None,
        keepalive_timeout=settings.header_timeout_seconds,
        lingering_time=1.0,
    )
    await runner.setup()
    handlers = runner.server
    assert handlers is not None

    def protocol() -> asyncio.BaseProtocol:
        if len(handlers.connections) >= settings.max_connections:
            return _Busy()
        return _PeerGate(handlers, settings.max_connections_per_peer)

    server = await asyncio.get_running_loop().create_server(protocol, host, port)
    return Listening(runner, server)


def serve(
    host: str,
    port: int,
    kubeconfig: str | None = None,
    settings: Settings | None = None,
    context: str | None = None,
) -> None:
    """Run the receiver until SIGINT/SIGTERM (what ``agentflows webhook`` does)."""

    async def run() -> None:
        tracing.configure("agentflows-webhook")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        async with kube.Client.from_env(kubeconfig, context, retry_seconds=10) as client:
            listening = await listen(make_app(client, settings), host, port)
            try:
                await stop.wait()
            finally:
                await listening.close()
                tracing.shutdown()

    asyncio.run(run())

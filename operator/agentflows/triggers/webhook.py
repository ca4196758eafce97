"""``agentflows webhook``: the receiver that turns HMAC-signed POSTs into FlowRuns.

``POST /hooks/{namespace}/{flow}/{trigger}`` with a GitHub-style ``X-Hub-Signature-256:
sha256=<hex HMAC-SHA256 of the raw body>``, keyed by the Secret the trigger names. Answers, in the
order they are checked:

- 413 a body over ``max_body_bytes`` (1 MiB; Content-Length first, then a capped read);
- 404 no such Flow, or no webhook trigger of that name in it;
- 401 signature missing or wrong (constant-time comparison);
- 400 the body is not JSON;
- 200 ``{"flowRun", "duplicate": true}`` a delivery id (``X-GitHub-Delivery`` or
  ``X-Delivery-Id``) already run within ``dedup_window_seconds`` (10 minutes): not run twice;
- 429 over the trigger's ``rateLimitPerMinute`` (with Retry-After);
- 422 the trigger's ``input`` expression failed on this body;
- 503 the trigger's Secret is missing, or the API server failed in a way worth retrying;
- 202 ``{"flowRun": NAME, "namespace": NS}``: the FlowRun was created.

The signature is checked before the body is parsed or counted against the rate limit, so an
unauthenticated sender can neither starve a trigger nor make the receiver parse its JSON.
``GET /healthz`` and ``GET /metrics`` (Prometheus; labels namespace, flow, trigger and code,
with unknown flows counted under empty labels so a scanner cannot grow the series).

The receiver needs only: get Flows, get the Secrets its triggers name, create FlowRuns. It caches
Flows for ``flow_ttl_seconds`` and secrets for ``secret_ttl_seconds``, so a rotated key takes
effect within that long. Delivery ids and rate limits live in memory (one replica, or sticky
routing, gives exact de-duplication).
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import prometheus_client
from aiohttp import web

from agentflows.api import flow as flow_api
from agentflows.kube import client as kube
from agentflows.triggers import common

log = logging.getLogger(__name__)

MIB = 1024 * 1024
SIGNATURE_HEADER = "X-Hub-Signature-256"
DELIVERY_HEADERS = ("X-GitHub-Delivery", "X-Delivery-Id")
_V = TypeVar("_V")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Limits and cache lifetimes of the receiver."""

    max_body_bytes: int = MIB
    dedup_window_seconds: float = 600.0
    max_deliveries: int = 100_000
    flow_ttl_seconds: float = 5.0
    secret_ttl_seconds: float = 30.0
    max_cached: int = 10_000


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
    """A Flow object and its webhook triggers by name."""

    flow: dict[str, Any]
    triggers: dict[str, flow_api.Trigger]


class _Reject(Exception):
    """Answer the request with ``status`` and a JSON ``{"error": message}``."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def signature(secret: bytes, body: bytes) -> str:
    """The ``X-Hub-Signature-256`` value of ``body``: ``sha256=<hex>``."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify_signature(secret: bytes, body: bytes, header: str | None) -> bool:
    """True when ``header`` is the HMAC-SHA256 of ``body`` under ``secret`` (constant time)."""
    if not header:
        return False
    expected = signature(secret, body).encode()
    return hmac.compare_digest(expected, header.strip().encode("utf-8", "replace"))


class Receiver:
    """The receiver's state: API client, caches, rate limiter, delivery ids and metrics."""

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
        self._flows: _TtlCache[_Target | None] = _TtlCache(
            settings.flow_ttl_seconds, settings.max_cached, clock
        )
        self._secrets: _TtlCache[bytes | None] = _TtlCache(
            settings.secret_ttl_seconds, settings.max_cached, clock
        )
        self.registry = prometheus_client.CollectorRegistry()
        self.requests = prometheus_client.Counter(
            "agentflows_webhook_requests_total",
            "Webhook deliveries by answer code.",
            ["namespace", "flow", "trigger", "code"],
            registry=self.registry,
        )
        self.duration = prometheus_client.Histogram(
            "agentflows_webhook_request_duration_seconds",
            "Time to answer a webhook delivery.",
            ["code"],
            registry=self.registry,
        )

    async def _target(self, namespace: str, flow: str) -> _Target | None:
        found, cached = self._flows.get((namespace, flow))
        if found:
            return cached
        target: _Target | None = None
        try:
            obj = await self.client.get(kube.path_of("flows", namespace, flow))
        except kube.ApiError as exc:
            if not exc.not_found:
                raise
        else:
            triggers: dict[str, flow_api.Trigger] = {}
            for raw in (obj.get("spec") or {}).get("triggers") or []:
                try:
                    trigger = flow_api.Trigger.model_validate(raw)
                except ValueError:
                    continue
                if trigger.webhook is not None:
                    triggers[trigger.name] = trigger
            target = _Target(obj, triggers)
        self._flows.put((namespace, flow), target)
        return target

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
            if not exc.not_found:
                raise
        self._secrets.put(key, value)
        return value

    async def _read_body(self, request: web.Request) -> bytes:
        # Content-Length was checked before; this catches chunked bodies and lying lengths.
        limit = self.settings.max_body_bytes
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = await request.content.read(65_536)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > limit:
                raise _Reject(413, f"body over {limit} bytes")
            chunks.append(chunk)

    async def deliver(
        self, request: web.Request, namespace: str, flow: str, name: str
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        """Check one delivery and create its FlowRun; return (status, JSON answer, headers)."""
        limit = self.settings.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise _Reject(413, f"body over {limit} bytes")
        target = await self._target(namespace, flow)
        trigger = target.triggers.get(name) if target else None
        if target is None or trigger is None or trigger.webhook is None:
            raise _Reject(404, f"no webhook trigger {name!r} in flow {namespace}/{flow}")
        body = await self._read_body(request)
        secret = await self._secret(namespace, trigger.webhook.secret)
        if secret is None:
            log.warning("secret of webhook trigger %s/%s/%s is missing", namespace, flow, name)
            raise _Reject(503, "the trigger's secret is not available", {"Retry-After": "30"})
        if not verify_signature(secret, body, request.headers.get(SIGNATURE_HEADER)):
            raise _Reject(401, f"missing or invalid {SIGNATURE_HEADER}")
        try:
            payload = json.loads(body)
        except ValueError as exc:
            raise _Reject(400, f"body is not JSON: {exc}") from exc
        delivery = next((request.headers[h] for h in DELIVERY_HEADERS if h in request.headers), "")
        dedup_key = f"{namespace}/{flow}/{name}/{delivery}"
        if delivery:
            previous = self.deliveries.claim(dedup_key, self.settings.dedup_window_seconds)
            if previous is not None:
                return 200, {"flowRun": previous, "duplicate": True}, {}
        try:
            return await self._create(target, trigger, payload, delivery, dedup_key)
        except BaseException:
            if delivery:
                self.deliveries.release(dedup_key)
            raise

    async def _create(
        self,
        target: _Target,
        trigger: flow_api.Trigger,
        payload: Any,
        delivery: str,
        dedup_key: str,
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        meta = target.flow["metadata"]
        bucket = f"{meta['namespace']}/{meta['name']}/{trigger.name}"
        if not self.limiter.allow(bucket, trigger.rate_limit_per_minute):
            wait = self.limiter.retry_after(bucket, trigger.rate_limit_per_minute)
            raise _Reject(429, "rate limit exceeded", {"Retry-After": str(max(1, round(wait)))})
        annotations = {common.DELIVERY_ANNOTATION: delivery} if delivery else {}
        request = common.RunRequest(payload=payload, annotations=annotations)
        try:
            run = await common.create_run(self.client, target.flow, trigger, request)
        except common.TriggerError as exc:
            raise _Reject(422, str(exc)) from exc
        run_name = str(run["metadata"]["name"])
        if delivery:
            self.deliveries.settle(dedup_key, run_name)
        return 202, {"flowRun": run_name, "namespace": meta["namespace"]}, {}

    async def handle_hook(self, request: web.Request) -> web.Response:
        """``POST /hooks/{namespace}/{flow}/{trigger}``."""
        started = time.perf_counter()
        namespace = request.match_info["namespace"]
        flow = request.match_info["flow"]
        name = request.match_info["trigger"]
        labels = (namespace, flow, name)
        try:
            status, answer, headers = await self.deliver(request, namespace, flow, name)
        except _Reject as reject:
            status, answer, headers = reject.status, {"error": reject.message}, reject.headers
        except kube.ApiError as exc:
            log.warning("webhook %s/%s/%s: %s", namespace, flow, name, exc)
            status = 503 if exc.retryable else 500
            answer, headers = {"error": f"API server: {exc.reason}"}, {}
        if status in (404, 413) and not await self._known(namespace, flow, name):
            labels = ("", "", "")
        self.requests.labels(*labels, str(status)).inc()
        self.duration.labels(str(status)).observe(time.perf_counter() - started)
        return web.json_response(answer, status=status, headers=headers)

    async def _known(self, namespace: str, flow: str, name: str) -> bool:
        found, target = self._flows.get((namespace, flow))
        return bool(found and target and name in target.triggers)

    async def handle_healthz(self, request: web.Request) -> web.Response:
        """``GET /healthz``: the process serves requests."""
        return web.json_response({"status": "ok"})

    async def handle_metrics(self, request: web.Request) -> web.Response:
        """``GET /metrics`` in the Prometheus text format."""
        return web.Response(
            body=prometheus_client.generate_latest(self.registry),
            headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST},
        )


RECEIVER = web.AppKey("receiver", Receiver)


def make_app(client: kube.Client, settings: Settings | None = None) -> web.Application:
    """The receiver's aiohttp application (the caller owns and closes ``client``)."""
    settings = settings or Settings()
    receiver = Receiver(client, settings)
    # The hook handler reads the body itself with a cap; this bounds everything else.
    app = web.Application(client_max_size=settings.max_body_bytes + 1)
    app[RECEIVER] = receiver
    app.router.add_post("/hooks/{namespace}/{flow}/{trigger}", receiver.handle_hook)
    app.router.add_get("/healthz", receiver.handle_healthz)
    app.router.add_get("/metrics", receiver.handle_metrics)
    return app


def serve(host: str, port: int, kubeconfig: str | None = None) -> None:
    """Run the receiver until SIGINT/SIGTERM (what ``agentflows webhook`` does)."""

    async def build() -> web.Application:
        client = kube.Client.from_env(kubeconfig, retry_seconds=10)
        app = make_app(client)

        async def close_client(_: web.Application) -> None:
            await client.close()

        app.on_cleanup.append(close_client)
        return app

    web.run_app(build(), host=host, port=port, print=None, access_log=None)

"""Live pages: one API watch per filter, shared by every page open on that filter, over SSE.

A page's script opens ``EventSource`` on an ``/events/...`` path. The server keeps one
:class:`Feed` per (identity, namespace, field selector): the first subscriber starts its list
and watch, as that user (so RBAC still decides what each user sees), later subscribers share it
and get its current objects at once, and the last one leaving stops it. A thousand runs on a
page cost one watch and one event per change per open page, never a poll per browser.

A watch the server ends is resumed from the last resourceVersion; a 410 (too old) lists again.
A refusal (403) or an unreachable API server is sent to the pages as an ``error`` event and the
feed stops; the page says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from agentflows.console import identity as identity_mod
from agentflows.kube import client as kube

log = logging.getLogger(__name__)

#: What a feed hands subscribers: ("upsert", object), ("delete", object) or ("error", text);
#: a stream of its own may end with (:data:`END`, value), sent last before the answer ends.
Change = tuple[str, Any]
END = "end"
#: How long a watch stays open before it is renewed (the API server ends it then).
WATCH_SECONDS = 240
#: Seconds between SSE comments that keep proxies from closing an idle stream.
KEEPALIVE_SECONDS = 20.0


def _key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name')}"


@dataclasses.dataclass
class Feed:
    """One list+watch of FlowRuns and the queues of the pages that follow it."""

    namespace: str | None
    selector: str | None
    objects: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    queues: set[asyncio.Queue[Change]] = dataclasses.field(default_factory=set)
    task: asyncio.Task[None] | None = None
    error: str | None = None

    def publish(self, change: Change) -> None:
        """Hand ``change`` to every subscriber."""
        for queue in self.queues:
            queue.put_nowait(change)

    async def follow(self, api: kube.Client) -> None:
        """List, then watch until cancelled, keeping :attr:`objects` current."""
        path = kube.path_of("flowruns", self.namespace)
        params = {"fieldSelector": self.selector} if self.selector else {}
        version: str | None = None
        try:
            while True:
                if version is None:
                    listed = await api.get(path, **params)
                    self._replace(listed.get("items") or [])
                    version = (listed.get("metadata") or {}).get("resourceVersion")
                try:
                    version = await self._watch(api, path, params, version)
                except kube.ApiError as exc:
                    if exc.status != 410:
                        raise
                    version = None  # too old to resume from: list again
        except kube.ApiError as exc:
            self.error = exc.message or str(exc)
            self.publish(("error", self.error))

    async def _watch(
        self, api: kube.Client, path: str, params: dict[str, str], version: str | None
    ) -> str | None:
        """One watch; the version to resume from (None: list again)."""
        async for event in api.watch(
            path, resource_version=version, timeout_seconds=WATCH_SECONDS, **params
        ):
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    return None
                raise kube.ApiError(int(obj.get("code") or 0), "", str(obj.get("message")))
            version = (obj.get("metadata") or {}).get("resourceVersion") or version
            if kind == "BOOKMARK":
                continue
            if kind == "DELETED":
                self.objects.pop(_key(obj), None)
                self.publish(("delete", obj))
            else:
                self.objects[_key(obj)] = obj
                self.publish(("upsert", obj))
        return version

    def _replace(self, items: list[dict[str, Any]]) -> None:
        fresh = {_key(o): o for o in items}
        for gone in set(self.objects) - set(fresh):
            self.publish(("delete", self.objects[gone]))
        self.objects = fresh
        for obj in items:
            self.publish(("upsert", obj))


class Hub:
    """The feeds the server holds, one per (identity, namespace, field selector)."""

    def __init__(self, gate: identity_mod.Gate) -> None:
        self.gate = gate
        self.feeds: dict[tuple[str, str, str], Feed] = {}

    @contextlib.asynccontextmanager
    async def subscribe(
        self, who: identity_mod.Identity, namespace: str | None, selector: str | None
    ) -> AsyncIterator[asyncio.Queue[Change]]:
        """A queue of changes, first the feed's current objects; the feed stops with its last."""
        key = (who.key(), namespace or "", selector or "")
        feed = self.feeds.get(key)
        if feed is None:
            feed = self.feeds[key] = Feed(namespace, selector)
            feed.task = asyncio.create_task(self._run(feed, who))
        queue: asyncio.Queue[Change] = asyncio.Queue()
        for obj in feed.objects.values():
            queue.put_nowait(("upsert", obj))
        if feed.error is not None:
            queue.put_nowait(("error", feed.error))
        feed.queues.add(queue)
        try:
            yield queue
        finally:
            feed.queues.discard(queue)
            if not feed.queues and self.feeds.get(key) is feed:
                del self.feeds[key]
                if feed.task is not None:
                    feed.task.cancel()

    @contextlib.asynccontextmanager
    async def subscribe_all(
        self, who: identity_mod.Identity, namespaces: list[str], selector: str | None
    ) -> AsyncIterator[asyncio.Queue[Change]]:
        """One queue of the changes of several namespaces, each followed by its own shared feed."""
        async with contextlib.AsyncExitStack() as stack:
            queues = [
                await stack.enter_async_context(self.subscribe(who, ns, selector))
                for ns in namespaces
            ]
            merged: asyncio.Queue[Change] = asyncio.Queue()

            async def forward(queue: asyncio.Queue[Change]) -> None:
                while True:
                    merged.put_nowait(await queue.get())

            tasks = [asyncio.create_task(forward(q)) for q in queues]
            try:
                yield merged
            finally:
                for task in tasks:
                    task.cancel()

    async def _run(self, feed: Feed, who: identity_mod.Identity) -> None:
        async with self.gate.client(who) as api:
            await feed.follow(api)

    async def close(self) -> None:
        """Stop every feed (the server is stopping)."""
        for feed in self.feeds.values():
            if feed.task is not None:
                feed.task.cancel()
        self.feeds.clear()


async def stream(
    request: web.Request,
    changes: asyncio.Queue[Change],
    message: Callable[[str, Any], dict[str, Any] | None],
) -> web.StreamResponse:
    """Send ``changes`` as server-sent events, each turned into JSON by ``message``.

    ``message`` returns None for a change the page does not show (another phase, say). An
    :data:`END` change is sent and ends the answer (the page closes its ``EventSource``, which
    would otherwise connect again).
    """
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    while True:
        ending = False
        try:
            kind, value = await asyncio.wait_for(changes.get(), KEEPALIVE_SECONDS)
        except TimeoutError:
            chunk = b": keepalive\n\n"
        else:
            ending = kind == END
            shown = {"type": "error", "message": value} if kind == "error" else message(kind, value)
            if shown is None:
                continue
            chunk = f"data: {json.dumps(shown, ensure_ascii=False)}\n\n".encode()
        try:
            await response.write(chunk)
        except ConnectionResetError:
            return response
        if ending:
            await response.write_eof()
            return response

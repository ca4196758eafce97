"""An in-memory cache of one kind's objects, kept current by a list and then a watch.

The webhook receiver answers from it, so that a request costs no API call before the object it
names is known to exist (one list at start and one long watch, whatever the request rate).

``await informer.run()`` runs until cancelled: it lists the collection page by page, replaces the
cache with what it found, sets ``ready``, then follows a watch from the list's resourceVersion,
applying ADDED/MODIFIED/DELETED. On 410 Gone or an ERROR event it lists again; on any other
failure it backs off (1 s doubling to 30 s) and lists again, keeping the last known objects
meanwhile. ``convert`` keeps only what the caller needs of each object (None: not kept), so the
cache holds no more than that.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from agentflows.kube import client as kube

log = logging.getLogger(__name__)

T = TypeVar("T")
Key = tuple[str, str]
PAGE_SIZE = 500
WATCH_TIMEOUT_SECONDS = 300
MAX_BACKOFF_SECONDS = 30.0


def key_of(obj: Mapping[str, Any]) -> Key:
    """``(namespace, name)`` of an object."""
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class Informer(Generic[T]):
    """Objects of one collection path by ``(namespace, name)``, converted by ``convert``."""

    def __init__(
        self, client: kube.Client, path: str, convert: Callable[[Mapping[str, Any]], T | None]
    ) -> None:
        self.client = client
        self.path = path
        self._convert = convert
        self._items: dict[Key, T] = {}
        #: Set once the first list has completed; the cache is complete from then on.
        self.ready = asyncio.Event()

    def get(self, namespace: str, name: str) -> T | None:
        """The converted object, or None when there is none (or it converted to None)."""
        return self._items.get((namespace, name))

    def __len__(self) -> int:
        return len(self._items)

    async def run(self) -> None:
        """List, then watch; again after 410 or a failure. Runs until cancelled."""
        backoff = 1.0
        while True:
            try:
                version: str | None = await self._list()
                self.ready.set()
                while version is not None:
                    version = await self._follow(version)
                    backoff = 1.0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("watch %s: %s; listing again in %.0fs", self.path, exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)

    async def _list(self) -> str:
        """Replace the cache with a full list; return its resourceVersion."""
        items: dict[Key, T] = {}
        params: dict[str, Any] = {"limit": PAGE_SIZE}
        while True:
            page = await self.client.get(self.path, **params)
            for obj in page.get("items") or []:
                self._put(items, obj)
            meta = page.get("metadata") or {}
            if not meta.get("continue"):
                self._items = items
                return str(meta.get("resourceVersion") or "")
            params["continue"] = meta["continue"]

    def _put(self, items: dict[Key, T], obj: Mapping[str, Any]) -> None:
        value = self._convert(obj)
        if value is None:
            items.pop(key_of(obj), None)
        else:
            items[key_of(obj)] = value

    async def _follow(self, version: str) -> str | None:
        """One watch request; the resourceVersion to go on from, or None to list again."""
        try:
            async for event in self.client.watch(
                self.path, resource_version=version, timeout_seconds=WATCH_TIMEOUT_SECONDS
            ):
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    log.info("watch %s ended: %s", self.path, obj.get("message"))
                    return None
                version = (obj.get("metadata") or {}).get("resourceVersion") or version
                if kind in ("ADDED", "MODIFIED"):
                    self._put(self._items, obj)
                elif kind == "DELETED":
                    self._items.pop(key_of(obj), None)
        except kube.ApiError as exc:
            if exc.status == 410:
                return None
            raise
        return version

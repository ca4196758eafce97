"""An in-memory cache of one kind's objects, kept current by a list and then a watch.

The webhook receiver answers from it, so that a request costs no API call before the object it
names is known to exist (one list at start and one long watch, whatever the request rate).

``await informer.run()`` runs until cancelled: it lists the collection page by page, replaces the
cache with what it found, sets ``ready``, then follows a watch from the list's resourceVersion,
applying ADDED/MODIFIED/DELETED. On 410 Gone or an ERROR event it lists again; on any other
failure it backs off (1 s doubling to 30 s) and lists again, keeping the last known objects
meanwhile. ``convert`` keeps only what the caller needs of each object (None: not kept), so the
cache holds no more than that.

``on_change(key, old, new)`` is called for every change the cache sees (``new`` None: gone), also
for what a new list finds different, so a caller can keep indexes and enqueue work. A writer may
:meth:`Informer.put` the object an API write returned: the cache never goes back to an older
``resourceVersion`` when the watch delivers the events before it, and the watch's echo of that
version is neither converted again nor reported as a change.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from agentflows.api import retry
from agentflows.kube import client as kube

log = logging.getLogger(__name__)

T = TypeVar("T")
Key = tuple[str, str]
#: ``on_change(key, old, new)``: converted values before and after (None: absent).
OnChange = Callable[[Key, Any, Any], None]
PAGE_SIZE = 500
WATCH_TIMEOUT_SECONDS = 300
#: After a failure, the watch lists again after 1 s, doubling to 30 s while failures go on.
WATCH_BACKOFF = retry.Backoff(initial=1.0, cap=30.0)
#: Deleted objects whose last version is remembered (against late write answers).
MAX_TOMBSTONES = 10_000


def key_of(obj: Mapping[str, Any]) -> Key:
    """``(namespace, name)`` of an object."""
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class Informer(Generic[T]):
    """Objects of one collection path by ``(namespace, name)``, converted by ``convert``."""

    def __init__(
        self,
        client: kube.Client,
        path: str,
        convert: Callable[[Mapping[str, Any]], T | None],
        *,
        on_change: OnChange | None = None,
        params: Mapping[str, str] | None = None,
    ) -> None:
        self.client = client
        self.path = path
        self._convert = convert
        self._on_change = on_change
        self._params = dict(params or {})
        self._items: dict[Key, T] = {}
        self._versions: dict[Key, int] = {}
        self._tombstones: collections.OrderedDict[Key, None] = collections.OrderedDict()
        #: Set once the first list has completed; the cache is complete from then on.
        self.ready = asyncio.Event()

    def get(self, namespace: str, name: str) -> T | None:
        """The converted object, or None when there is none (or it converted to None)."""
        return self._items.get((namespace, name))

    def __len__(self) -> int:
        return len(self._items)

    def items(self) -> dict[Key, T]:
        """Every object held (a view: do not change it)."""
        return self._items

    def put(self, obj: Mapping[str, Any]) -> None:
        """Take ``obj`` as returned by a write, unless the cache already has a newer version."""
        self._apply(obj)

    def _apply(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        key = key_of(obj)
        version = _version(obj)
        known = self._versions.get(key)
        if version is not None and known is not None and version < known:
            return
        if not deleted and version is not None and version == known and key in self._items:
            return  # held already: the watch's echo of a write that was put
        old = self._items.get(key)
        new = None if deleted else self._convert(obj)
        if new is None:
            self._items.pop(key, None)
            self._versions.pop(key, None)
            if deleted and version is not None:
                # a write's answer older than the deletion must not bring the object back
                self._versions[key] = version
                self._tombstones[key] = None
                while len(self._tombstones) > MAX_TOMBSTONES:
                    self._versions.pop(self._tombstones.popitem(last=False)[0], None)
        else:
            self._tombstones.pop(key, None)
            self._items[key] = new
            if version is not None:
                self._versions[key] = version
        if self._on_change is not None and (old is not None or new is not None):
            self._on_change(key, old, new)

    async def run(self) -> None:
        """List, then watch; again after 410 or a failure. Runs until cancelled."""
        tries = WATCH_BACKOFF.tries()
        while True:
            try:
                version: str | None = await self._list()
                self.ready.set()
                while version is not None:
                    version = await self._follow(version)
                    tries.reset()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                delay = tries.next_delay()
                log.warning("watch %s: %s; listing again in %.0fs", self.path, exc, delay)
                await asyncio.sleep(delay)

    async def _list(self) -> str:
        """Bring the cache to a full list; return its resourceVersion."""
        seen: set[Key] = set()
        params: dict[str, Any] = {**self._params, "limit": PAGE_SIZE}
        while True:
            page = await self.client.get(self.path, **params)
            for obj in page.get("items") or []:
                seen.add(key_of(obj))
                # a list is the truth: an older version than a write-through is not possible
                self._versions.pop(key_of(obj), None)
                self._apply(obj)
            meta = page.get("metadata") or {}
            if not meta.get("continue"):
                for key in [k for k in self._items if k not in seen]:
                    namespace, name = key
                    self._apply({"metadata": {"namespace": namespace, "name": name}}, True)
                return str(meta.get("resourceVersion") or "")
            params["continue"] = meta["continue"]

    async def _follow(self, version: str) -> str | None:
        """One watch request; the resourceVersion to go on from, or None to list again."""
        try:
            async for event in self.client.watch(
                self.path,
                resource_version=version,
                timeout_seconds=WATCH_TIMEOUT_SECONDS,
                **self._params,
            ):
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    log.info("watch %s ended: %s", self.path, obj.get("message"))
                    return None
                version = (obj.get("metadata") or {}).get("resourceVersion") or version
                if kind in ("ADDED", "MODIFIED"):
                    self._apply(obj)
                elif kind == "DELETED":
                    self._apply(obj, deleted=True)
        except kube.ApiError as exc:
            if exc.status == 410:
                return None
            raise
        return version


def _version(obj: Mapping[str, Any]) -> int | None:
    """The object's resourceVersion as a number (etcd's revision), if it is one."""
    value = (obj.get("metadata") or {}).get("resourceVersion")
    return int(value) if isinstance(value, str) and value.isdigit() else None

"""Kubernetes triggers: shared watches that turn matching object changes into FlowRuns.

The operator owns one :class:`WatchManager` and calls ``await manager.sync(flows)`` with every
Flow object it knows whenever a Flow changes (and ``await manager.close()`` on shutdown). The
manager keeps one watch per (apiVersion, kind) that some trigger names, starts and stops them
as triggers come and go, and hands each watch event to every trigger of that kind:

1. event type in the trigger's ``eventTypes`` (default ADDED, MODIFIED);
2. the trigger's namespace (its Flow's own unless it names another, or ``*`` for all — a
   wider scope is admitted only for a writer who may list and watch the kind there,
   ``config/policies/trigger-scope.yaml``), ``labelSelector`` and ``fieldSelector`` match
   (always checked here; when every trigger of a kind agrees on a namespace or selector, the
   watch itself is narrowed to it as well, so the API server does the filtering);
3. the jq ``filter`` over ``{event: {type, object}}`` is truthy, evaluated within
   ``common.EXPRESSION_SECONDS`` and a memory limit (in a worker process unless it is provably
   cheap) while the triggers of the same event are evaluated concurrently; a filter that hits
   a bound is suspended until its Flow changes, so one looping filter costs one bound, once,
   never every event of the kind;
4. not a repeat: the same object and reason within ``dedupWindowSeconds`` (for core/v1 and
   events.k8s.io Events the object is the one the Event is about, so a crash-looping Pod's many
   BackOff Events start one run; for other kinds the reason is ``status.reason`` or the event
   type);
5. within the trigger's ``rateLimitPerMinute`` (a flood is dropped, never queued);
6. not a loop: when the object is one of a run's own (the FlowRun, its runner pod, or an Event
   about either — the operator's ``lineage`` lookup answers from its cache), a trigger never
   fires for its own Flow's runs, and a chain of runs started by other runs' objects (A's run's
   Event starts B, whose run's Event starts A, ...) stops after :data:`MAX_TRIGGER_DEPTH` hops,
   counted in each run's ``agentflows.io/trigger-depth`` annotation. A refused delivery is
   counted (:attr:`WatchManager.loops_refused`) and the Flow's author told once per Flow
   generation (``on_loop``: a Warning Event ``TriggerLoop`` on the Flow, and
   :meth:`WatchManager.refused` for the Flow's ``TriggersRefused`` condition);

then a FlowRun is created with ``payload = {type, object}``, the object trimmed to its identity,
labels and, for Events, reason, message and the involved object. The Flow's concurrency policy
applies to it like to any run.

A watch starts from the current resourceVersion (a fresh list with ``limit=1``), so only changes
after the trigger appeared start runs. On 410 Gone it re-lists; on other errors it backs off
as the informer does (:data:`agentflows.kube.informer.WATCH_BACKOFF`, 1 s doubling to 30 s)
and re-lists. Changes during a gap are not replayed: triggers act on what happens while they
watch. The operator needs list/watch on every kind its users' triggers name.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from agentflows.api import flow as flow_api
from agentflows.api import wellknown
from agentflows.engine import expressions
from agentflows.kube import client as kube
from agentflows.kube import informer
from agentflows.triggers import common

log = logging.getLogger(__name__)

WatchKey = tuple[str, str]
EVENT_KINDS = {("v1", "Event"), ("events.k8s.io/v1", "Event")}
MAX_MESSAGE = 4096
WATCH_TIMEOUT_SECONDS = 300


# --- selectors -------------------------------------------------------------------------------

_SET_OP = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s*\((.*)\)\s*$")
_EQ_OP = re.compile(r"^\s*([^\s!=]+)\s*(==|=|!=)\s*(\S*)\s*$")


def _split(selector: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, current = [], 0, ""
    for char in selector:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def label_selector_matches(selector: str | None, labels: Mapping[str, str]) -> bool:
    """Whether ``labels`` satisfy a Kubernetes label selector string."""
    for term in _split(selector or ""):
        found = _SET_OP.match(term)
        if found:
            key, op, values = found.groups()
            allowed = {v.strip() for v in values.split(",") if v.strip()}
            if (op == "in") != (labels.get(key) in allowed):
                return False
            continue
        found = _EQ_OP.match(term)
        if found:
            key, op, value = found.groups()
            if (op == "!=") == (labels.get(key) == value):
                return False
            continue
        if term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def _field_text(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def field_selector_matches(selector: str | None, obj: Mapping[str, Any]) -> bool:
    """Whether ``obj`` satisfies a field selector (``path=value``, ``path!=value``, ANDed)."""
    for term in _split(selector or ""):
        found = _EQ_OP.match(term)
        if not found:
            return False
        path, op, value = found.groups()
        if (op == "!=") == (_field_text(obj, path) == value):
            return False
    return True


# --- what a trigger sees -----------------------------------------------------------------------


def trim(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a watched object a run gets: identity, labels and, for Events, what happened."""
    meta = obj.get("metadata") or {}
    trimmed: dict[str, Any] = {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": {
            k: meta[k]
            for k in ("name", "namespace", "uid", "labels", "resourceVersion")
            if k in meta
        },
    }
    for key in ("reason", "type", "count", "involvedObject", "regarding", "source"):
        if key in obj:
            trimmed[key] = obj[key]
    for key in ("message", "note"):
        if isinstance(obj.get(key), str):
            trimmed[key] = obj[key][:MAX_MESSAGE]
    return trimmed


def dedup_identity(key: WatchKey, event_type: str, obj: Mapping[str, Any]) -> str:
    """``<object>|<reason>``: an Event counts as its involved object; others as themselves."""
    if key in EVENT_KINDS:
        about = obj.get("involvedObject") or obj.get("regarding") or {}
        ident = about.get("uid") or "/".join(
            str(about.get(k, "")) for k in ("namespace", "kind", "name")
        )
        return f"{ident}|{obj.get('reason', '')}"
    meta = obj.get("metadata") or {}
    status = obj.get("status")
    reason = status.get("reason") if isinstance(status, Mapping) else None
    return f"{meta.get('uid') or meta.get('name')}|{reason or event_type}"


@dataclasses.dataclass(frozen=True)
class _Binding:
    """One kubernetes trigger of one Flow, compiled."""

    flow: Mapping[str, Any]
    trigger: flow_api.Trigger
    source: flow_api.KubernetesSource
    filter: expressions.Template | None

    @property
    def name(self) -> str:
        meta = self.flow["metadata"]
        return f"{meta['namespace']}/{meta['name']}/{self.trigger.name}"

    @property
    def namespace(self) -> str | None:
        """The namespace this trigger sees (None: every namespace)."""
        return self.source.watched_namespace(str(self.flow["metadata"]["namespace"]))

    @property
    def identity(self) -> tuple[str, Any, str]:
        """The trigger as written: the Flow's uid and generation and the trigger's name."""
        meta = self.flow["metadata"]
        return (str(meta.get("uid", "")), meta.get("generation"), self.trigger.name)

    def selected(self, event_type: str, obj: Mapping[str, Any]) -> bool:
        """Event type, namespace and selectors match (the filter aside)."""
        source = self.source
        meta = obj.get("metadata") or {}
        if event_type not in source.event_types:
            return False
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        if not label_selector_matches(source.label_selector, meta.get("labels") or {}):
            return False
        return field_selector_matches(source.field_selector, obj)

    async def matches(self, event_type: str, obj: Mapping[str, Any]) -> bool:
        """Selected, and the filter (if any) is truthy; ExpressionError from the filter."""
        if not self.selected(event_type, obj):
            return False
        if self.filter is None:
            return True
        scope = common.expression_scope({"event": {"type": event_type, "object": obj}})
        return expressions.truthy(await expressions.evaluate_async(self.filter, scope))


def _bindings_of(flow_obj: Mapping[str, Any]) -> list[_Binding]:
    if (flow_obj.get("metadata") or {}).get("deletionTimestamp"):
        return []
    try:
        triggers = common.triggers_of(flow_obj)
    except common.TriggerError as exc:
        log.warning("flow %s: %s", flow_obj.get("metadata", {}).get("name"), exc)
        return []
    bindings = []
    for trigger in triggers:
        if trigger.kubernetes is None:
            continue
        try:
            common.check_expressions(trigger)
            source = trigger.kubernetes
            compiled = expressions.compile_expression(source.filter) if source.filter else None
        except (common.TriggerError, expressions.ExpressionError) as exc:
            log.warning("flow %s: %s", flow_obj["metadata"].get("name"), exc)
            continue
        bindings.append(_Binding(flow_obj, trigger, trigger.kubernetes, compiled))
    return bindings


# --- watches -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Scope:
    """What the API server is asked to filter: agreed on by every trigger of the kind."""

    namespace: str | None
    label_selector: str | None
    field_selector: str | None

    @classmethod
    def common_to(cls, bindings: list[_Binding]) -> _Scope:
        def agreed(values: set[str | None]) -> str | None:
            return values.pop() if len(values) == 1 else None

        return cls(
            agreed({b.namespace for b in bindings}),
            agreed({b.source.label_selector for b in bindings}),
            agreed({b.source.field_selector for b in bindings}),
        )


@dataclasses.dataclass
class _Watch:
    key: WatchKey
    scope: _Scope
    task: asyncio.Task[None] | None = None
    #: True once the watch knows its starting resourceVersion: changes from then on fire.
    established: bool = False


#: How long a filter is evaluated again while every evaluator is busy before its event is
#: dropped (and logged): long enough for the filters holding them to hit their bounds.
_BUSY_PATIENCE_SECONDS = 60.0
#: Called with the Flow, the trigger's name and why, when a trigger is suspended.
Suspended = Callable[[Mapping[str, Any], str, str], Awaitable[None]]
#: (namespace, kind, name) of an object -> (Flow, trigger depth) of the run it belongs to.
Lineage = Callable[[str, str, str], tuple[str, int] | None]
#: The most trigger hops from run to run through their own objects (a loop ends there).
MAX_TRIGGER_DEPTH = 3


def _no_lineage(namespace: str, kind: str, name: str) -> None:
    return None


def about(key: WatchKey, obj: Mapping[str, Any]) -> tuple[str, str, str]:
    """(namespace, kind, name) of what a change is about: an Event's object, else itself."""
    if key in EVENT_KINDS:
        target = obj.get("involvedObject") or obj.get("regarding") or {}
        meta = obj.get("metadata") or {}
        namespace = target.get("namespace") or meta.get("namespace") or ""
        return str(namespace), str(target.get("kind", "")), str(target.get("name", ""))
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace", "")), key[1], str(meta.get("name", ""))


class WatchManager:
    """Shared watches for the ``kubernetes`` triggers of every Flow, and the runs they start."""

    def __init__(
        self,
        client: kube.Client,
        on_suspended: Suspended | None = None,
        *,
        lineage: Lineage = _no_lineage,
        on_loop: Suspended | None = None,
    ) -> None:
        self.client = client
        #: Told when a trigger is suspended, so the Flow's author learns it (an Event).
        self.on_suspended = on_suspended
        self.lineage = lineage
        #: Told once per trigger (and Flow generation) when a delivery is refused as a loop.
        self.on_loop = on_loop
        #: Deliveries refused as loops, by trigger (``namespace/flow/trigger``).
        self.loops_refused: collections.Counter[str] = collections.Counter()
        self._loops_told: set[tuple[str, Any, str]] = set()
        #: Why a trigger refused a delivery or was suspended, by identity (the Flow's status).
        self._refused: dict[tuple[str, Any, str], str] = {}
        self.limiter = common.RateLimiter()
        self.dedup = common.Deduplicator()
        self._bindings: dict[WatchKey, list[_Binding]] = {}
        self._watches: dict[WatchKey, _Watch] = {}
        self._paths: dict[tuple[str, str, str | None], str] = {}
        #: Triggers whose filter hit its bound, by identity: skipped until the Flow changes.
        self._suspended: set[tuple[str, Any, str]] = set()

    def refused(self, flow_obj: Mapping[str, Any]) -> list[str]:
        """``trigger NAME: why`` for each trigger of this Flow generation that refused/halted."""
        meta = flow_obj["metadata"]
        uid, generation = str(meta.get("uid", "")), meta.get("generation")
        return sorted(
            f"trigger {name}: {why}"
            for (u, g, name), why in self._refused.items()
            if (u, g) == (uid, generation)
        )

    async def sync(self, flows: Iterable[Mapping[str, Any]]) -> None:
        """Watch exactly what the kubernetes triggers of ``flows`` (every Flow) need."""
        wanted: dict[WatchKey, list[_Binding]] = {}
        for flow_obj in flows:
            for binding in _bindings_of(flow_obj):
                key = (binding.source.api_version, binding.source.kind)
                wanted.setdefault(key, []).append(binding)
        self._bindings = wanted
        current = {b.identity for bindings in wanted.values() for b in bindings}
        self._suspended &= current
        self._loops_told &= current
        self._refused = {k: v for k, v in self._refused.items() if k in current}
        for key in list(self._watches):
            watch = self._watches[key]
            if key not in wanted or _Scope.common_to(wanted[key]) != watch.scope:
                await self._stop(key)
        for key, bindings in wanted.items():
            if key not in self._watches:
                watch = _Watch(key, _Scope.common_to(bindings))
                watch.task = asyncio.create_task(self._run(watch), name=f"watch {key}")
                self._watches[key] = watch

    def watches(self) -> dict[WatchKey, bool]:
        """The running watches: (apiVersion, kind) -> established."""
        return {key: watch.established for key, watch in self._watches.items()}

    async def close(self) -> None:
        """Stop every watch."""
        self._bindings = {}
        for key in list(self._watches):
            await self._stop(key)

    async def _stop(self, key: WatchKey) -> None:
        watch = self._watches.pop(key)
        if watch.task is not None:
            watch.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch.task

    async def _path(self, key: WatchKey, namespace: str | None) -> str:
        """The collection path of a kind (API discovery, cached)."""
        api_version, kind = key
        cached = self._paths.get((api_version, kind, namespace))
        if cached:
            return cached
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        discovery = await self.client.get(base)
        resource = next(
            (
                r
                for r in discovery.get("resources", [])
                if r.get("kind") == kind and "/" not in r.get("name", "")
            ),
            None,
        )
        if resource is None:
            raise common.TriggerError(f"the API server serves no kind {kind} in {api_version}")
        scoped = namespace and resource.get("namespaced")
        prefix = f"{base}/namespaces/{namespace}" if scoped else base
        path = f"{prefix}/{resource['name']}"
        self._paths[(api_version, kind, namespace)] = path
        return path

    async def _run(self, watch: _Watch) -> None:
        """List for a resourceVersion, then watch from it; re-list on 410, back off on errors."""
        tries = informer.WATCH_BACKOFF.tries()
        server_fields = watch.scope.field_selector is not None
        while True:
            try:
                path = await self._path(watch.key, watch.scope.namespace)
                params: dict[str, Any] = {}
                if watch.scope.label_selector:
                    params["labelSelector"] = watch.scope.label_selector
                if server_fields and watch.scope.field_selector:
                    params["fieldSelector"] = watch.scope.field_selector
                try:
                    listing = await self.client.get(path, limit=1, **params)
                except kube.ApiError as exc:
                    if exc.status == 400 and "fieldSelector" in params:
                        # Not a field the server can select on: filter here instead.
                        server_fields = False
                        continue
                    raise
                version = listing["metadata"]["resourceVersion"]
                watch.established = True
                while version is not None:
                    version = await self._follow(watch, path, version, params)
                    tries.reset()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                delay = tries.next_delay()
                log.warning("watch %s/%s: %s; retrying in %.0fs", *watch.key, exc, delay)
                await asyncio.sleep(delay)

    async def _follow(
        self, watch: _Watch, path: str, version: str, params: dict[str, Any]
    ) -> str | None:
        """One watch request; the resourceVersion to go on from, or None to re-list."""
        try:
            async for event in self.client.watch(
                path, resource_version=version, timeout_seconds=WATCH_TIMEOUT_SECONDS, **params
            ):
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    log.info("watch %s/%s ended: %s", *watch.key, obj.get("message"))
                    return None
                version = (obj.get("metadata") or {}).get("resourceVersion") or version
                if kind != "BOOKMARK":
                    await self._dispatch(watch.key, str(kind), obj)
        except kube.ApiError as exc:
            if exc.status == 410:
                return None
            raise
        return version

    async def _dispatch(self, key: WatchKey, event_type: str, obj: Mapping[str, Any]) -> None:
        """Start a run for every trigger of the kind that this change matches.

        The triggers are considered concurrently: a slow filter delays no other trigger.
        """
        bindings = [b for b in self._bindings.get(key, []) if b.identity not in self._suspended]
        await asyncio.gather(*(self._consider(b, key, event_type, obj) for b in bindings))

    async def _consider(
        self, binding: _Binding, key: WatchKey, event_type: str, obj: Mapping[str, Any]
    ) -> None:
        try:
            if await self._matches(binding, event_type, obj):
                await self._fire(binding, key, event_type, obj)
        except expressions.ExpressionLimit as exc:
            self._suspended.add(binding.identity)
            message = f"{exc}; suspended until the Flow changes"
            self._refused[binding.identity] = message
            log.warning("trigger %s: %s", binding.name, message)
            if self.on_suspended is not None:
                await self.on_suspended(binding.flow, binding.trigger.name, message)
        except (expressions.ExpressionError, common.TriggerError) as exc:
            log.warning("trigger %s: %s", binding.name, exc)
        except kube.ApiError as exc:
            log.warning("trigger %s: creating a FlowRun: %s", binding.name, exc)

    @staticmethod
    async def _matches(binding: _Binding, event_type: str, obj: Mapping[str, Any]) -> bool:
        """The filter's verdict; evaluated again while other filters held every evaluator.

        Waiting for an evaluator is not the filter's fault: a filter that hits its own bound
        is suspended, so the evaluators come free, and this event is not lost meanwhile.
        """
        give_up = time.monotonic() + _BUSY_PATIENCE_SECONDS
        while True:
            try:
                return await binding.matches(event_type, obj)
            except expressions.ExpressionBusy:
                if time.monotonic() >= give_up:
                    raise

    async def _fire(
        self, binding: _Binding, key: WatchKey, event_type: str, obj: Mapping[str, Any]
    ) -> None:
        depth = await self._depth(binding, key, obj)
        if depth is None:
            return
        identity = dedup_identity(key, event_type, obj)
        flow_uid = binding.flow["metadata"].get("uid", "")
        dedup_key = f"{flow_uid}/{binding.trigger.name}/{identity}"
        if self.dedup.claim(dedup_key, binding.source.dedup_window_seconds) is not None:
            return
        if not self.limiter.allow(binding.name, binding.trigger.rate_limit_per_minute):
            self.dedup.release(dedup_key)
            log.info("trigger %s: rate limit reached; dropped %s", binding.name, identity)
            return
        request = common.RunRequest(
            payload={"type": event_type, "object": trim(obj)},
            annotations={
                wellknown.DEDUP_ANNOTATION: identity,
                wellknown.DEPTH_ANNOTATION: str(depth),
            },
        )
        try:
            run = await common.create_run(self.client, binding.flow, binding.trigger, request)
        except BaseException:
            self.dedup.release(dedup_key)
            raise
        self.dedup.settle(dedup_key, str(run["metadata"]["name"]))
        log.info("trigger %s started %s for %s", binding.name, run["metadata"]["name"], identity)

    async def _depth(self, binding: _Binding, key: WatchKey, obj: Mapping[str, Any]) -> int | None:
        """The new run's trigger depth; None (counted, told once) when it would be a loop."""
        namespace, kind, name = about(key, obj)
        origin = self.lineage(namespace, kind, name)
        if origin is None:
            return 0
        flow, depth = origin
        meta = binding.flow["metadata"]
        if (namespace, flow) == (meta["namespace"], meta["name"]):
            why = f"{kind} {name} belongs to a run of this Flow"
        elif depth + 1 > MAX_TRIGGER_DEPTH:
            why = (
                f"{kind} {name} belongs to a run of Flow {flow} started by {depth} trigger hops "
                f"from run to run (at most {MAX_TRIGGER_DEPTH})"
            )
        else:
            return depth + 1
        self.loops_refused[binding.name] += 1
        if binding.identity not in self._loops_told:
            self._loops_told.add(binding.identity)
            message = f"{why}: a trigger never fires on its own runs' objects (a loop)"
            self._refused[binding.identity] = message
            log.warning("trigger %s: refused: %s", binding.name, message)
            if self.on_loop is not None:
                await self.on_loop(binding.flow, binding.trigger.name, message)
        return None

"""The operator's view of the cluster: Agents, Flows, FlowRuns and runner pods, kept by watches.

One list and one long watch per kind (:class:`agentflows.kube.informer.Informer`) keep every
object the operator handles in memory, parsed once when it changes: Agents and Flows into their
spec models (with the problems of a spec that does not parse), FlowRuns into
:class:`agentflows.api.flowrun.FlowRun`, runner pods into the few fields the operator reads.
Reconciles read from here and never GET what they handle; a write's answer is put back
(:meth:`Cache.stored`), so the next reconcile sees it before its watch event arrives.

Indexes: a namespace's specs (what :func:`agentflows.engine.graph.validate` resolves against),
the runs of each Flow, and who names each Agent and Flow (``referrers``), so that a change is
followed by the reconciles it affects and no other: an Agent's new generation re-validates the
Flows and Agents that reach it, a run's new phase refreshes its Flow's summary.

A finished run is kept small (its metadata, spec and the status keys the operator still reads),
which is what lets one operator hold 10,000 runs. Objects outside this operator's namespaces or
shard are not kept at all. :attr:`Cache.synced` is set once every first list has completed:
before that a missing object may only be not listed yet, so no reconcile runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

import pydantic

from agentflows import api as api_group
from agentflows.api import agent as agent_api
from agentflows.api import budget as budget_api
from agentflows.api import calls, documents, wellknown
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.controller.runtime import workqueue
from agentflows.engine import graph
from agentflows.kube import client as kube
from agentflows.kube import informer

log = logging.getLogger(__name__)

S = TypeVar("S", agent_api.AgentSpec, flow_api.FlowSpec)
Enqueue = Callable[[str, str, str, float], None]
#: Seconds a Flow's summary waits for more run changes before it is written.
SUMMARY_DELAY_SECONDS = 1.0
#: Annotations not kept in memory (kubectl's copy of the whole object).
_DROPPED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)
#: Status keys a finished run keeps in memory.
_FINISHED_KEYS = frozenset(
    {"phase", "reason", "message", "startTime", "completionTime", "duration", "attempt", "pod"}
)


@dataclasses.dataclass(frozen=True)
class Spec(Generic[S]):
    """An Agent or Flow: the object (metadata and status) and its spec parsed once."""

    obj: dict[str, Any]
    spec: S | None
    problems: tuple[documents.Problem, ...]

    @property
    def name(self) -> str:
        """The object's name."""
        return str(self.obj["metadata"]["name"])

    @property
    def generation(self) -> int:
        """``metadata.generation`` (spec changes only)."""
        return int(self.obj["metadata"].get("generation") or 0)

    @property
    def uid(self) -> str:
        """``metadata.uid``."""
        return str(self.obj["metadata"].get("uid") or "")


@dataclasses.dataclass(frozen=True)
class Run:
    """A FlowRun: its metadata and spec as stored (small once finished), and its parsed form."""

    obj: dict[str, Any]
    model: flowrun_api.FlowRun

    @property
    def flow(self) -> str:
        """The Flow it runs."""
        return self.model.spec.flow

    @property
    def status(self) -> flowrun_api.FlowRunStatus:
        """Its status (empty before anyone wrote one)."""
        return self.model.status or flowrun_api.FlowRunStatus()


@dataclasses.dataclass(frozen=True)
class Pod:
    """A runner pod, as much as the operator reads of it."""

    name: str
    run: str
    phase: str
    deleting: bool
    ended: str


@dataclasses.dataclass
class Namespace:
    """The parsed specs of one namespace, by name (what validation resolves against)."""

    agents: dict[str, agent_api.AgentSpec] = dataclasses.field(default_factory=dict)
    flows: dict[str, flow_api.FlowSpec] = dataclasses.field(default_factory=dict)

    def resolver(self) -> graph.StaticResolver:
        """A resolver over these specs."""
        return graph.StaticResolver(agents=self.agents, flows=self.flows)


def _trimmed_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    kept = {k: v for k, v in meta.items() if k != "managedFields"}
    annotations = meta.get("annotations")
    if annotations and any(a in annotations for a in _DROPPED_ANNOTATIONS):
        kept["annotations"] = {
            k: v for k, v in annotations.items() if k not in _DROPPED_ANNOTATIONS
        }
    return kept


def _parse_spec(model: type[S], kind: str, obj: Mapping[str, Any]) -> Spec[S]:
    # a listed object may carry no kind: Events and owner references need it
    kept = {
        **obj,
        "apiVersion": api_group.API_VERSION,
        "kind": kind,
        "metadata": _trimmed_meta(obj.get("metadata") or {}),
    }
    try:
        return Spec(kept, model.model_validate(obj.get("spec") or {}), ())
    except pydantic.ValidationError as exc:
        return Spec(kept, None, tuple(documents.validation_problems(exc, prefix="spec")))


def _parse_run(obj: Mapping[str, Any]) -> Run | None:
    status = obj.get("status") or {}
    finished = status.get("phase") in flowrun_api.TERMINAL_PHASES
    if finished:
        status = {k: v for k, v in status.items() if k in _FINISHED_KEYS}
    spec: dict[str, Any] = dict(obj.get("spec") or {})
    meta = _trimmed_meta(obj.get("metadata") or {})
    kept: dict[str, Any] = {
        "apiVersion": api_group.API_VERSION,
        "kind": "FlowRun",
        "metadata": meta,
        "spec": {"flow": spec.get("flow"), "cancel": spec.get("cancel", False)}
        if finished
        else spec,
        "status": status,
    }
    try:
        model = flowrun_api.FlowRun.model_validate(kept)
    except pydantic.ValidationError as exc:
        log.error("FlowRun %s/%s is not kept: %s", meta.get("namespace"), meta.get("name"), exc)
        return None
    del kept["status"]  # held once, parsed, in the model
    return Run(kept, model)


def _parse_budget(obj: Mapping[str, Any]) -> budget_api.Budget | None:
    meta = _trimmed_meta(obj.get("metadata") or {})
    kept = {"metadata": meta, "spec": obj.get("spec") or {}, "status": obj.get("status")}
    try:
        return budget_api.Budget.model_validate(kept)
    except pydantic.ValidationError as exc:
        log.error("Budget %s/%s is not kept: %s", meta.get("namespace"), meta.get("name"), exc)
        return None


def _pod_run(meta: Mapping[str, Any]) -> str | None:
    for owner in meta.get("ownerReferences") or []:
        if owner.get("kind") == "FlowRun":
            return str(owner["name"])
    return None


def describe_exit(status: Mapping[str, Any]) -> str:
    """How a pod's container ended: ``exit code 1, Error``."""
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated:
            reason = terminated.get("reason") or "Terminated"
            return f"exit code {terminated.get('exitCode')}, {reason}"
    return str(status.get("reason") or status.get("phase", "unknown"))


def _parse_pod(obj: Mapping[str, Any]) -> Pod | None:
    meta = obj.get("metadata") or {}
    run = _pod_run(meta)
    if run is None:
        return None
    status = obj.get("status") or {}
    phase = str(status.get("phase") or "Pending")
    ended = describe_exit(status) if phase in ("Succeeded", "Failed") else ""
    return Pod(str(meta["name"]), run, phase, bool(meta.get("deletionTimestamp")), ended)


def _flow_refs(spec: flow_api.FlowSpec | None) -> set[tuple[str, str]]:
    """What a Flow names (a tool node's Agent too): a change to one re-validates the Flow."""
    return set() if spec is None else {call.ref for call in calls.calls(spec)}


def _agent_refs(spec: agent_api.AgentSpec | None) -> set[tuple[str, str]]:
    return set() if spec is None else {call.ref for call in calls.agent_calls(spec)}


class Cache:
    """Every Agent, Flow, FlowRun and runner pod of the operator's namespaces, by watches."""

    def __init__(
        self,
        api: kube.Client,
        namespaces: Iterable[str],
        owns: Callable[[str], bool],
        enqueue: Enqueue,
    ) -> None:
        self.api = api
        self._owns = owns
        self._enqueue = enqueue
        self._namespaces: dict[str, Namespace] = {}
        self._runs_by_flow: dict[tuple[str, str], set[str]] = {}
        #: (namespace, kind, name) -> who names it: {(kind, name)}.
        self._referrers: dict[tuple[str, str, str], set[tuple[str, str]]] = {}
        self.synced = asyncio.Event()
        scopes = list(namespaces) or [""]
        self.agents = self._kind("agents", scopes, self._agent, self._agent_changed)
        self.flows = self._kind("flows", scopes, self._flow, self._flow_changed)
        self.runs = self._kind("flowruns", scopes, self._run, self._run_changed)
        selector = {"labelSelector": f"{wellknown.MANAGED_BY}={wellknown.MANAGER},{wellknown.RUN}"}
        self.pods = self._kind("pods", scopes, self._pod, self._pod_changed, selector)
        self.budgets = self._kind("budgets", scopes, self._budget, self._budget_changed)

    def _kind(
        self,
        plural: str,
        scopes: list[str],
        convert: Callable[[Mapping[str, Any]], Any],
        changed: informer.OnChange,
        params: Mapping[str, str] | None = None,
    ) -> dict[str, informer.Informer[Any]]:
        """One informer per namespace watched ("" for all of them)."""
        return {
            scope: informer.Informer(
                self.api,
                kube.path_of(plural, scope or None),
                convert,
                on_change=changed,
                params=params,
            )
            for scope in scopes
        }

    def _informers(self) -> list[informer.Informer[Any]]:
        return [i for kind in self._kinds() for i in kind.values()]

    def _kinds(self) -> tuple[dict[str, informer.Informer[Any]], ...]:
        return (self.agents, self.flows, self.runs, self.pods, self.budgets)

    async def run(self) -> None:
        """Keep every watch going (until cancelled); set :attr:`synced` after the first lists."""
        tasks = [asyncio.create_task(i.run()) for i in self._informers()]
        try:
            await asyncio.gather(*(i.ready.wait() for i in self._informers()))
            self.synced.set()
            log.info(
                "cache synced: %d Agents, %d Flows, %d FlowRuns, %d runner pods, %d Budgets",
                *(sum(len(i) for i in kind.values()) for kind in self._kinds()),
            )
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    @staticmethod
    def _scope(family: dict[str, informer.Informer[Any]], namespace: str) -> Any:
        """The informer holding ``namespace``'s objects of a kind, if it is watched."""
        # not ``family.get(namespace) or ...``: an informer holding nothing yet is falsy (len 0)
        scope = family.get(namespace)
        return scope if scope is not None else family.get("")

    # ----- reads ---------------------------------------------------------------------------

    def _get(self, family: dict[str, informer.Informer[Any]], namespace: str, name: str) -> Any:
        scope = self._scope(family, namespace)
        return scope.get(namespace, name) if scope is not None else None

    def agent(self, namespace: str, name: str) -> Spec[agent_api.AgentSpec] | None:
        """An Agent."""
        found: Spec[agent_api.AgentSpec] | None = self._get(self.agents, namespace, name)
        return found

    def flow(self, namespace: str, name: str) -> Spec[flow_api.FlowSpec] | None:
        """A Flow."""
        found: Spec[flow_api.FlowSpec] | None = self._get(self.flows, namespace, name)
        return found

    def run_of(self, namespace: str, name: str) -> Run | None:
        """A FlowRun."""
        found: Run | None = self._get(self.runs, namespace, name)
        return found

    def pod(self, namespace: str, name: str) -> Pod | None:
        """A runner pod."""
        found: Pod | None = self._get(self.pods, namespace, name)
        return found

    def budget(self, namespace: str, name: str) -> budget_api.Budget | None:
        """A Budget."""
        found: budget_api.Budget | None = self._get(self.budgets, namespace, name)
        return found

    def budgets_in(self, namespace: str) -> list[budget_api.Budget]:
        """The namespace's Budgets."""
        scope = self._scope(self.budgets, namespace)
        items = scope.items() if scope is not None else {}
        return [b for (ns, _), b in sorted(items.items()) if ns == namespace]

    def namespace(self, namespace: str) -> Namespace:
        """The parsed specs of a namespace (a live view: do not change it)."""
        return self._namespaces.get(namespace) or Namespace()

    def runs_of(self, namespace: str, flow: str) -> list[Run]:
        """The runs of one Flow."""
        names = self._runs_by_flow.get((namespace, flow), ())
        return [run for name in names if (run := self.run_of(namespace, name)) is not None]

    def names(self, kind: str, namespace: str) -> list[str]:
        """The names of the namespace's Agents or Flows (parsed or not)."""
        family = self.agents if kind == workqueue.AGENT else self.flows
        scope = self._scope(family, namespace)
        items = scope.items() if scope is not None else {}
        return sorted(n for (ns, n) in items if ns == namespace)

    def referrers(self, namespace: str, kind: str, name: str) -> set[tuple[str, str]]:
        """Every Agent and Flow that reaches ``kind/name``, directly or through others."""
        found: set[tuple[str, str]] = set()
        stack = [(kind, name)]
        while stack:
            for referrer in self._referrers.get((namespace, *stack.pop()), ()):
                if referrer not in found:
                    found.add(referrer)
                    stack.append(referrer)
        return found

    # ----- writes' answers -----------------------------------------------------------------

    def stored(self, obj: Mapping[str, Any]) -> None:
        """Take what an API write returned (never older than what is held)."""
        kind = obj.get("kind")
        families = {
            "FlowRun": self.runs,
            "Flow": self.flows,
            "Agent": self.agents,
            "Pod": self.pods,
            "Budget": self.budgets,
        }
        family = families.get(str(kind))
        namespace = str((obj.get("metadata") or {}).get("namespace") or "")
        scope = self._scope(family, namespace) if family is not None else None
        if scope is not None:
            scope.put(obj)

    # ----- conversion (None: not this operator's) ------------------------------------------

    def _mine(self, obj: Mapping[str, Any]) -> bool:
        return self._owns(str((obj.get("metadata") or {}).get("namespace") or ""))

    def _agent(self, obj: Mapping[str, Any]) -> Spec[agent_api.AgentSpec] | None:
        return _parse_spec(agent_api.AgentSpec, "Agent", obj) if self._mine(obj) else None

    def _flow(self, obj: Mapping[str, Any]) -> Spec[flow_api.FlowSpec] | None:
        return _parse_spec(flow_api.FlowSpec, "Flow", obj) if self._mine(obj) else None

    def _run(self, obj: Mapping[str, Any]) -> Run | None:
        return _parse_run(obj) if self._mine(obj) else None

    def _pod(self, obj: Mapping[str, Any]) -> Pod | None:
        return _parse_pod(obj) if self._mine(obj) else None

    def _budget(self, obj: Mapping[str, Any]) -> budget_api.Budget | None:
        return _parse_budget(obj) if self._mine(obj) else None

    # ----- what a change sets off ----------------------------------------------------------

    def _index_refs(
        self,
        namespace: str,
        who: tuple[str, str],
        old: set[tuple[str, str]],
        new: set[tuple[str, str]],
    ) -> None:
        for ref in old - new:
            key = (namespace, *ref)
            names = self._referrers.get(key)
            if names is not None:
                names.discard(who)
                if not names:
                    del self._referrers[key]
        for ref in new - old:
            self._referrers.setdefault((namespace, *ref), set()).add(who)

    def _spec_changed(
        self,
        kind: str,
        key: informer.Key,
        old: Spec[Any] | None,
        new: Spec[Any] | None,
        refs: Callable[[Any], set[tuple[str, str]]],
    ) -> None:
        namespace, name = key
        specs = self._namespaces.setdefault(namespace, Namespace())
        table: dict[str, Any] = specs.agents if kind == workqueue.AGENT else specs.flows
        if new is not None and new.spec is not None:
            table[name] = new.spec
        else:
            table.pop(name, None)
        self._index_refs(
            namespace,
            (kind, name),
            refs(old.spec if old else None),
            refs(new.spec if new else None),
        )
        self._enqueue(kind, namespace, name, 0.0)
        moved = old is None or new is None or (old.generation, old.uid) != (new.generation, new.uid)
        if moved:
            for ref_kind, ref_name in self.referrers(namespace, kind, name):
                self._enqueue(ref_kind, namespace, ref_name, 0.0)

    def _agent_changed(self, key: informer.Key, old: Any, new: Any) -> None:
        self._spec_changed(workqueue.AGENT, key, old, new, _agent_refs)

    def _flow_changed(self, key: informer.Key, old: Any, new: Any) -> None:
        self._spec_changed(workqueue.FLOW, key, old, new, _flow_refs)

    def _run_changed(self, key: informer.Key, old: Run | None, new: Run | None) -> None:
        namespace, name = key
        if old is not None and (new is None or new.flow != old.flow):
            runs = self._runs_by_flow.get((namespace, old.flow))
            if runs is not None:
                runs.discard(name)
                if not runs:
                    del self._runs_by_flow[(namespace, old.flow)]
        if new is not None:
            self._runs_by_flow.setdefault((namespace, new.flow), set()).add(name)
        self._enqueue(workqueue.FLOWRUN, namespace, name, 0.0)
        before = (old.flow, old.status.phase, old.status.attempt) if old else None
        after = (new.flow, new.status.phase, new.status.attempt) if new else None
        for flow in {x[0] for x in (before, after) if x is not None and before != after}:
            self._enqueue(workqueue.SUMMARY, namespace, flow, SUMMARY_DELAY_SECONDS)

    def _budget_changed(self, key: informer.Key, old: Any, new: Any) -> None:
        self._enqueue(workqueue.BUDGET, key[0], key[1], 0.0)

    def _pod_changed(self, key: informer.Key, old: Pod | None, new: Pod | None) -> None:
        if old == new:
            return  # a status detail the operator does not read (conditions, IPs, ...)
        pod = new or old
        if pod is not None:
            self._enqueue(workqueue.FLOWRUN, key[0], pod.run, 0.0)

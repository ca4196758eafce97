"""The FlowRun a trigger creates, plus the two guards every trigger shares: rate limit and dedup.

Used by ``schedule`` (``agentflows trigger``), ``webhook`` and ``kubernetes``. A triggered run
carries the labels ``agentflows.io/flow``, ``agentflows.io/trigger`` and
``agentflows.io/trigger-type`` (so ``kubectl get flowruns -l agentflows.io/flow=NAME`` lists
runs with their trigger), ``spec.trigger = {type, name, payload}``, and as ``spec.input`` the
trigger's ``input`` template evaluated over ``{run: {trigger: {type, name, payload, ...}}}``.
A de-duplication key or delivery id is kept as an annotation, so a user can see why a repeat
did not start a run. Manual runs (``agentflows start``) never come through here.

Trigger expressions (the ``input`` template here, the kubernetes ``filter``) are evaluated with
:func:`expressions.evaluate_async` and a deadline of :data:`EXPRESSION_SECONDS`: one Flow's
looping or memory-hungry expression fails that Flow's trigger within the bound, in a worker
process, while the event loop goes on serving every other Flow.

Both guards keep their state in memory only, bounded in size: they protect the cluster from a
flood; they are not a ledger (a restarted receiver or operator starts with empty ones).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from agentflows import api as api_group
from agentflows.api import errors, wellknown
from agentflows.api import flow as flow_api
from agentflows.engine import expressions
from agentflows.kube import client as kube
from agentflows.kube import objects

#: Annotation values are bounded so a hostile delivery id cannot bloat the object.
MAX_ANNOTATION = 256
#: Longest a trigger's ``input`` or ``filter`` expression may run for one event.
EXPRESSION_SECONDS = 2.0


class TriggerError(errors.AgentflowsError):
    """A trigger cannot fire: the Flow or the trigger is missing or invalid.

    Permanent: retrying does not help until someone edits the Flow.
    """


def triggers_of(flow_obj: Mapping[str, Any]) -> list[flow_api.Trigger]:
    """The Flow object's triggers, parsed (a bad one raises TriggerError naming it)."""
    parsed = []
    for index, raw in enumerate((flow_obj.get("spec") or {}).get("triggers") or []):
        try:
            parsed.append(flow_api.Trigger.model_validate(raw))
        except ValueError as exc:
            raise TriggerError(f"spec.triggers[{index}]: {exc}") from exc
    return parsed


def find_trigger(flow_obj: Mapping[str, Any], name: str) -> flow_api.Trigger:
    """The trigger called ``name``; TriggerError when the Flow has none of that name."""
    for trigger in triggers_of(flow_obj):
        if trigger.name == name:
            return trigger
    flow = flow_obj.get("metadata", {}).get("name")
    raise TriggerError(f"flow {flow} has no trigger {name!r}")


def type_of(trigger: flow_api.Trigger) -> str:
    """``schedule``, ``webhook`` or ``kubernetes``."""
    if trigger.schedule is not None:
        return "schedule"
    if trigger.webhook is not None:
        return "webhook"
    return "kubernetes"


def check_expressions(trigger: flow_api.Trigger) -> None:
    """Compile the trigger's ``input`` and jq ``filter``; raise TriggerError on a bad one."""
    try:
        expressions.compile_template(trigger.input)
        if trigger.kubernetes is not None and trigger.kubernetes.filter:
            expressions.compile_expression(trigger.kubernetes.filter)
    except expressions.ExpressionError as exc:
        raise TriggerError(f"trigger {trigger.name}: {exc}") from exc


def trigger_value(
    trigger: flow_api.Trigger, payload: Any, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """What ``run.trigger`` is while the input is evaluated: ``{type, name, payload, **extra}``."""
    return {"type": type_of(trigger), "name": trigger.name, "payload": payload, **(extra or {})}


@functools.lru_cache(maxsize=1024)
def _compiled(source: str) -> expressions.Template:
    # jq compiles in about a millisecond; a busy webhook or watch fires the same input often.
    return expressions.compile_template(json.loads(source))


def expression_scope(values: Mapping[str, Any]) -> expressions.Scope:
    """A trigger expression's scope, bounded by :data:`EXPRESSION_SECONDS` from now."""
    return expressions.Scope(values, deadline=time.monotonic() + EXPRESSION_SECONDS)


def evaluate_input(trigger: flow_api.Trigger, value: Mapping[str, Any]) -> Any:
    """The run input: the trigger's ``input`` template over ``{run: {trigger: value}}``."""
    try:
        template = _compiled(json.dumps(trigger.input, sort_keys=True))
        return expressions.evaluate(template, expression_scope({"run": {"trigger": value}}))
    except expressions.ExpressionError as exc:
        raise TriggerError(f"trigger {trigger.name} input: {exc}") from exc


async def evaluate_input_async(trigger: flow_api.Trigger, value: Mapping[str, Any]) -> Any:
    """:func:`evaluate_input` for the event loop (a bounded program runs in a thread)."""
    try:
        template = _compiled(json.dumps(trigger.input, sort_keys=True))
        scope = expression_scope({"run": {"trigger": value}})
        return await expressions.evaluate_async(template, scope)
    except expressions.ExpressionError as exc:
        raise TriggerError(f"trigger {trigger.name} input: {exc}") from exc


@dataclasses.dataclass(frozen=True)
class RunRequest:
    """Everything that makes one triggered FlowRun besides the Flow and the trigger."""

    payload: Any = None
    #: Extra keys of ``run.trigger`` for the input expression (``scheduledTime``).
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: A fixed name (schedules: the Job's name, so a retried pod never makes two runs).
    name: str | None = None
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)


def flowrun_body(
    flow_obj: Mapping[str, Any], trigger: flow_api.Trigger, request: RunRequest
) -> dict[str, Any]:
    """The FlowRun manifest a trigger creates (same shape as ``agentflows start``)."""
    run_input = evaluate_input(trigger, trigger_value(trigger, request.payload, request.extra))
    return _body(flow_obj, trigger, request, run_input)


def _body(
    flow_obj: Mapping[str, Any], trigger: flow_api.Trigger, request: RunRequest, run_input: Any
) -> dict[str, Any]:
    flow = flow_obj["metadata"]["name"]
    kind = type_of(trigger)
    metadata: dict[str, Any] = (
        {"name": request.name} if request.name else {"generateName": f"{flow}-"}
    )
    metadata["labels"] = {
        wellknown.FLOW: objects.label_value(flow),
        wellknown.TRIGGER: trigger.name,
        wellknown.TRIGGER_TYPE: kind,
        wellknown.MANAGED_BY: wellknown.MANAGER,
    }
    if request.annotations:
        metadata["annotations"] = {k: v[:MAX_ANNOTATION] for k, v in request.annotations.items()}
    return {
        "apiVersion": api_group.API_VERSION,
        "kind": "FlowRun",
        "metadata": metadata,
        "spec": {
            "flow": flow,
            "input": run_input,
            "trigger": {"type": kind, "name": trigger.name, "payload": request.payload},
        },
    }


async def create_run(
    client: kube.Client,
    flow_obj: Mapping[str, Any],
    trigger: flow_api.Trigger,
    request: RunRequest,
) -> dict[str, Any]:
    """Create the FlowRun; with a fixed name, an existing run of that name is returned."""
    value = trigger_value(trigger, request.payload, request.extra)
    body = _body(flow_obj, trigger, request, await evaluate_input_async(trigger, value))
    path = kube.path_of("flowruns", flow_obj["metadata"]["namespace"])
    try:
        created: dict[str, Any] = await client.create(path, body)
    except kube.ApiError as exc:
        # A fixed name that exists means this very run was created before (a retried pod).
        # The existing object is not read back: the trigger's account may only create.
        if not (exc.conflict and request.name):
            raise
        return body
    return created


class RateLimiter:
    """Token buckets, one per key (a trigger): ``per_minute`` runs, bursts up to the same.

    Memory is bounded by ``max_keys``; the least recently used bucket is dropped first (it
    comes back full, which only errs towards letting a quiet trigger through).
    """

    def __init__(self, *, max_keys: int = 10_000, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._max_keys = max_keys
        self._buckets: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()

    def allow(self, key: str, per_minute: int) -> bool:
        """Take one token from ``key``'s bucket; False when it is empty."""
        now = self._clock()
        tokens, stamp = self._buckets.pop(key, (float(per_minute), now))
        tokens = min(float(per_minute), tokens + (now - stamp) * per_minute / 60.0)
        allowed = tokens >= 1.0
        if allowed:
            tokens -= 1.0
        self._buckets[key] = (tokens, now)
        while len(self._buckets) > self._max_keys:
            self._buckets.popitem(last=False)
        return allowed

    def retry_after(self, key: str, per_minute: int) -> float:
        """Seconds until ``key`` has a token again."""
        tokens, _ = self._buckets.get(key, (float(per_minute), 0.0))
        return max(0.0, (1.0 - tokens) * 60.0 / per_minute)


class Deduplicator:
    """Remembers keys for a window: ``claim`` says whether a key was seen within it.

    A claim holds a value (the run's name, once known). A failed run creation ``release``s its
    claim so a redelivery may try again. At most ``max_keys`` keys are kept; beyond that the
    oldest are forgotten (a flood then degrades to rate limiting, never to unbounded memory).
    """

    def __init__(self, *, max_keys: int = 100_000, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._max_keys = max_keys
        #: key -> (expiry, value), in insertion order.
        self._entries: collections.OrderedDict[str, tuple[float, str]] = collections.OrderedDict()

    def _prune(self, now: float) -> None:
        while self._entries:
            key, (expiry, _) = next(iter(self._entries.items()))
            if expiry > now and len(self._entries) <= self._max_keys:
                return
            del self._entries[key]

    def claim(self, key: str, window_seconds: float, value: str = "") -> str | None:
        """Claim ``key`` for the window; return None if claimed now, else the held value."""
        now = self._clock()
        self._prune(now)
        held = self._entries.get(key)
        if held is not None and held[0] > now:
            return held[1]
        if window_seconds <= 0:
            return None
        self._entries.pop(key, None)
        self._entries[key] = (now + window_seconds, value)
        while len(self._entries) > self._max_keys:
            self._entries.popitem(last=False)
        return None

    def settle(self, key: str, value: str) -> None:
        """Keep ``value`` (the created run's name) with a claimed key."""
        held = self._entries.get(key)
        if held is not None:
            self._entries[key] = (held[0], value)

    def release(self, key: str) -> None:
        """Forget a claim (its run was not created)."""
        self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)

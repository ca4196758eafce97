"""One reconcile's view of a FlowRun: its typed status, the changes to it, the Events they imply.

Built from the cache (:meth:`RunContext.of`). Helpers change :attr:`RunContext.status`, a
:class:`~agentflows.api.flowrun.FlowRunStatus` (the model the CRD is generated from), and record
Events; :meth:`RunContext.save` writes the operator's status keys (``kube/NOTES.md``) that differ
from what is stored as one merge patch, puts the answer into the cache, then posts the Events.
A reconcile that changed nothing writes nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from agentflows.api import common, times
from agentflows.api import requests as human_requests
from agentflows.api.flowrun import FlowRunStatus, RunnerResult, RunPhase, RunReason
from agentflows.controller import cache, conditions, context, events
from agentflows.kube import client as kube
from agentflows.kube import objects

#: Event type of a phase change: a failure is a warning.
_EVENT_TYPE = {RunPhase.FAILED: events.WARNING}
#: Phases announced with an Event: where a human may act, and the end. Pending and Running are
#: in status only (an Event is an API request; a trivial run costs two: Running would be a third).
_ANNOUNCED = frozenset(
    {RunPhase.QUEUED, RunPhase.WAITING, RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.CANCELLED}
)
#: The status fields the operator writes; every other one belongs to the runner or a human.
OPERATOR_FIELDS = (
    "observed_generation",
    "phase",
    "conditions",
    "start_time",
    "completion_time",
    "duration",
    "attempt",
    "pod",
    "pod_created",
    "attempts_lost",
    "message",
    "reason",
    "budget_charged",
    "snapshot_digest",
)


_DURATION_KEY = common.wire_name(FlowRunStatus, "duration")


def _wire(status: FlowRunStatus, field: str) -> Any:
    value = getattr(status, field)
    if isinstance(value, list):
        return [item.model_dump(mode="json", exclude_none=True) for item in value]
    if isinstance(value, common.Usage):
        return value.to_wire()
    return value.value if isinstance(value, RunPhase) else value


@dataclasses.dataclass
class RunContext:
    """A FlowRun being reconciled."""

    obj: dict[str, Any]
    #: The status as stored.
    stored: FlowRunStatus
    #: The status as it will be after :meth:`save`.
    status: FlowRunStatus
    pending_events: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, run: cache.Run) -> RunContext:
        """A context over a cached run."""
        # a shallow copy: every change assigns a field (never mutates a stored value in place)
        return cls(obj=run.obj, stored=run.status, status=run.status.model_copy())

    @property
    def namespace(self) -> str:
        """The run's namespace."""
        return str(self.obj["metadata"]["namespace"])

    @property
    def name(self) -> str:
        """The run's name."""
        return str(self.obj["metadata"]["name"])

    @property
    def uid(self) -> str:
        """The run's uid."""
        return str(self.obj["metadata"].get("uid") or "")

    @property
    def flow(self) -> str:
        """The Flow the run runs."""
        return str((self.obj.get("spec") or {}).get("flow", ""))

    @property
    def path(self) -> str:
        """The run's API path."""
        return kube.path_of("flowruns", self.namespace, self.name)

    @property
    def phase(self) -> RunPhase | None:
        """The phase after the pending changes."""
        return self.status.phase

    @property
    def attempt(self) -> int:
        """The current attempt (0: no pod yet)."""
        return self.status.attempt

    def result(self) -> RunnerResult | None:
        """The runner's result for the current attempt, if it wrote one."""
        result = self.stored.result
        return result if result is not None and result.attempt == self.attempt else None

    def refresh(self, obj: dict[str, Any], ctl: context.Controller) -> None:
        """Take the run as read (keeping the pending changes) and give it to the cache."""
        pending = {f: getattr(self.status, f) for f in OPERATOR_FIELDS if self._changed(f)}
        self._take(obj, ctl)
        self.status = self.stored.model_copy(update=pending)

    def _take(self, obj: dict[str, Any], ctl: context.Controller) -> None:
        """Take ``obj`` as the stored run, with no pending change, and give it to the cache."""
        ctl.cache.stored(obj)
        self.obj = obj
        self.stored = FlowRunStatus.model_validate(obj.get("status") or {})
        self.status = self.stored.model_copy()

    def _changed(self, field: str) -> bool:
        return bool(_wire(self.status, field) != _wire(self.stored, field))

    def set_phase(self, phase: RunPhase, reason: RunReason, message: str) -> None:
        """Move to ``phase`` (an Event when it changes) and set the matching conditions."""
        changed = self.status.phase != phase
        self.status.phase = phase
        self.set_message(reason, message)
        succeeded: tuple[str, str, str, str]
        waiting: tuple[str, str, str, str]
        if phase is RunPhase.SUCCEEDED:
            succeeded = ("Succeeded", "True", reason, message)
        elif phase.terminal:
            succeeded = ("Succeeded", "False", reason, message)
        else:
            succeeded = ("Succeeded", "Unknown", phase.value, message)
        if phase is RunPhase.WAITING:
            waiting = ("Waiting", "True", reason, message)
        else:
            waiting = ("Waiting", "False", phase.value, "")
        self._set_conditions(succeeded, waiting)
        self.status.observed_generation = self.obj["metadata"].get("generation")
        if phase.terminal and not self.status.completion_time:
            self.status.completion_time = times.api_time()
        if changed and phase in _ANNOUNCED:
            self.event(_EVENT_TYPE.get(phase, events.NORMAL), reason, message)

    def set_condition(self, type_: str, status: str, reason: str, message: str = "") -> None:
        """Set one condition (its transition time moves only when its status changes)."""
        self._set_conditions((type_, status, reason, message))

    def _set_conditions(self, *updates: tuple[str, str, str, str]) -> None:
        current = [c.model_dump(by_alias=True) for c in self.status.conditions]
        generation = self.obj["metadata"].get("generation")
        for type_, status, reason, message in updates:
            current = conditions.set_condition(
                current, type_, status, reason, message, generation=generation
            )
        self.status.conditions = [common.Condition.model_validate(c) for c in current]

    def condition(self, type_: str) -> common.Condition | None:
        """The condition of that type, after the pending changes."""
        return next((c for c in self.status.conditions if c.type == type_), None)

    def set_message(self, reason: RunReason, message: str) -> None:
        """Set ``reason`` and ``message`` (no Event)."""
        self.status.reason = reason
        self.status.message = message

    def reserve_attempt(self, attempt: int) -> None:
        """Make ``attempt`` current: its pod name goes into status before the pod exists."""
        self.status.attempt = attempt
        self.status.pod = objects.pod_name(self.name, attempt)
        if not self.status.start_time:
            self.status.start_time = times.api_time()

    def event(self, type_: str, reason: str, message: str) -> None:
        """Post an Event after the next save."""
        self.pending_events.append((type_, reason, message))

    def changes(self) -> dict[str, Any]:
        """The merge patch of the operator's status keys that differ from what is stored."""
        return {
            common.wire_name(FlowRunStatus, f): _wire(self.status, f)
            for f in OPERATOR_FIELDS
            if self._changed(f)
        }

    async def save(self, ctl: context.Controller) -> None:
        """Write the pending status changes (one merge patch), then post the Events."""
        changes = self.changes()
        if changes:
            duration = times.duration(self.status.start_time, self.status.completion_time)
            if duration is not None and duration != self.stored.duration:
                self.status.duration = duration
                changes[_DURATION_KEY] = duration
            stored = await ctl.api.merge_patch(self.path + "/status", context.status_patch(changes))
            self._take(stored, ctl)  # what was pending is written now
        for type_, reason, message in self.pending_events:
            await events.post(ctl.api, self.obj, type_, reason, message)
        self.pending_events = []
        self.observe(ctl)

    def observe(self, ctl: context.Controller) -> None:
        """Update the run gauges from the current status."""
        phase = self.phase.value if self.phase else RunPhase.PENDING.value
        terminal = self.phase is not None and self.phase.terminal
        pending = {} if terminal else human_requests.pending_by_kind(self.status)
        ctl.metrics.observe_run(self.namespace, self.name, self.flow, phase, pending)

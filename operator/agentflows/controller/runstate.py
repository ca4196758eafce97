"""One reconcile's view of a FlowRun: a copy of the object, the status changes, the Events.

Built once per reconcile from a fresh GET (:meth:`RunContext.of`); helpers record changes to the
operator's status keys (``kube/NOTES.md``) and the Events they imply; :meth:`RunContext.save`
writes them as one merge patch of those keys only, then posts the Events. Nothing is written
for a reconcile that changed nothing.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from agentflows.api.flowrun import RunPhase
from agentflows.controller import conditions, context, events, labels, requests, workqueue
from agentflows.kube import client as kube

#: Event type of a phase change: a failure is a warning.
_EVENT_TYPE = {RunPhase.FAILED: events.WARNING}


@dataclasses.dataclass
class RunContext:
    """A FlowRun being reconciled."""

    obj: dict[str, Any]
    status: dict[str, Any]
    patch: dict[str, Any] = dataclasses.field(default_factory=dict)
    pending_events: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, obj: dict[str, Any]) -> RunContext:
        """A context over a copy of ``obj``."""
        copied = copy.deepcopy(obj)
        return cls(obj=copied, status=copied.get("status") or {})

    @property
    def namespace(self) -> str:
        """The run's namespace."""
        return str(self.obj["metadata"]["namespace"])

    @property
    def name(self) -> str:
        """The run's name."""
        return str(self.obj["metadata"]["name"])

    @property
    def flow(self) -> str:
        """The Flow the run runs."""
        return str((self.obj.get("spec") or {}).get("flow", ""))

    @property
    def path(self) -> str:
        """The run's API path."""
        return kube.path_of("flowruns", self.namespace, self.name)

    def get(self, key: str) -> Any:
        """A status key as it will be after the pending patch."""
        return self.patch[key] if key in self.patch else self.status.get(key)

    @property
    def phase(self) -> RunPhase | None:
        """The phase after the pending patch."""
        value = self.get("phase")
        return RunPhase(value) if value else None

    @property
    def attempt(self) -> int:
        """The current attempt (0: no pod yet)."""
        return int(self.get("attempt") or 0)

    def result(self) -> dict[str, Any] | None:
        """The runner's result for the current attempt, if it wrote one."""
        result = self.status.get("result")
        if isinstance(result, dict) and result.get("attempt") == self.attempt:
            return result
        return None

    def refresh(self, obj: dict[str, Any]) -> None:
        """Take a newer copy of the object (keeping the pending patch)."""
        self.obj = copy.deepcopy(obj)
        self.status = self.obj.get("status") or {}

    def set_phase(self, phase: RunPhase, reason: str, message: str) -> None:
        """Move to ``phase`` (an Event when it changes) and set the matching conditions."""
        changed = self.phase != phase
        self.patch["phase"] = phase.value
        self.set_message(reason, message)
        generation = self.obj["metadata"].get("generation")
        conds = list(self.get("conditions") or [])
        if phase is RunPhase.SUCCEEDED:
            conds = conditions.set_condition(conds, "Succeeded", "True", reason, message)
        elif phase.terminal:
            conds = conditions.set_condition(conds, "Succeeded", "False", reason, message)
        else:
            conds = conditions.set_condition(conds, "Succeeded", "Unknown", phase.value, message)
        if phase is RunPhase.WAITING:
            conds = conditions.set_condition(conds, "Waiting", "True", reason, message)
        else:
            conds = conditions.set_condition(conds, "Waiting", "False", phase.value)
        self.patch["conditions"] = [{**c, "observedGeneration": generation} for c in conds]
        self.patch["observedGeneration"] = generation
        if phase.terminal and not self.get("completionTime"):
            self.patch["completionTime"] = conditions.timestamp()
        if changed:
            self.event(_EVENT_TYPE.get(phase, events.NORMAL), reason, message)

    def set_condition(self, type_: str, status: str, reason: str, message: str = "") -> None:
        """Set one condition (its transition time moves only when its status changes)."""
        generation = self.obj["metadata"].get("generation")
        conds = list(self.get("conditions") or [])
        self.patch["conditions"] = conditions.set_condition(
            conds, type_, status, reason, message, generation=generation
        )

    def set_message(self, reason: str, message: str) -> None:
        """Set ``reason`` and ``message`` (no Event)."""
        if self.get("reason") != reason:
            self.patch["reason"] = reason
        if self.get("message") != message:
            self.patch["message"] = message

    def reserve_attempt(self, attempt: int) -> None:
        """Make ``attempt`` current: its pod name goes into status before the pod exists."""
        self.patch["attempt"] = attempt
        self.patch["pod"] = labels.pod_name(self.name, attempt)
        if not self.get("startTime"):
            self.patch["startTime"] = conditions.timestamp()

    def event(self, type_: str, reason: str, message: str) -> None:
        """Post an Event after the next save."""
        self.pending_events.append((type_, reason, message))

    def _duration(self) -> str | None:
        started = conditions.parse_time(self.get("startTime"))
        if started is None:
            return None
        ended = conditions.parse_time(self.get("completionTime")) or conditions.now()
        return conditions.format_duration((ended - started).total_seconds())

    async def save(self, ctl: context.Controller) -> None:
        """Write the pending status changes (merge patch of operator keys), then the Events."""
        duration = self._duration()
        if self.patch and duration is not None and duration != self.status.get("duration"):
            self.patch["duration"] = duration
        if self.patch:
            phase_changed = "phase" in self.patch and self.patch["phase"] != self.status.get(
                "phase"
            )
            changes = {k: v for k, v in self.patch.items() if self.status.get(k) != v}
            if changes:
                stored = await ctl.api.merge_patch(
                    self.path + "/status", context.status_patch(changes)
                )
                self.refresh(stored)
            self.patch = {}
            if phase_changed:
                ctl.enqueue(workqueue.FLOW, self.namespace, self.flow)
        for type_, reason, message in self.pending_events:
            await events.post(ctl.api, self.obj, type_, reason, message)
        self.pending_events = []
        self.observe(ctl)

    def observe(self, ctl: context.Controller) -> None:
        """Update the run gauges from the current status."""
        phase = self.phase.value if self.phase else RunPhase.PENDING.value
        pending = (
            {} if self.phase and self.phase.terminal else requests.pending_by_kind(self.status)
        )
        ctl.metrics.observe_run(self.namespace, self.name, self.flow, phase, pending)

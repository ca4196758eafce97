"""The FlowRun resource: one execution of a Flow, whose status is the run's durable state.

Status has several writers, each owning its keys (merge patches, never a full replace):
the operator (phase, conditions, attempt, pod), the runner (nodes, output, usage, new
requests) and humans (the decision fields of a request).
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, field_validator

from agentflows.api import common

#: A node record keeps the errors of this many earlier attempts, each cut to this length.
MAX_ATTEMPT_ERRORS = 5
MAX_ATTEMPT_ERROR_CHARS = 512


class RunPhase(enum.StrEnum):
    """Where a run is in its life."""

    #: Created; no runner pod yet.
    PENDING = "Pending"
    #: Held back by the Flow's concurrency policy (Queue).
    QUEUED = "Queued"
    #: A runner is executing nodes.
    RUNNING = "Running"
    #: Paused on one or more human requests; no pod runs.
    WAITING = "Waiting"
    #: Finished; status.output holds the result.
    SUCCEEDED = "Succeeded"
    #: Finished with an error; status.message says why.
    FAILED = "Failed"
    #: Stopped by spec.cancel or by a concurrency policy.
    CANCELLED = "Cancelled"

    @property
    def terminal(self) -> bool:
        """True once the run can change no more."""
        return self in (RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.CANCELLED)


#: The values of the phases a run never leaves (for wire dicts: ``phase in TERMINAL_PHASES``).
TERMINAL_PHASES = frozenset(p.value for p in RunPhase if p.terminal)

#: A loop keeps the records of its first iteration and of its latest ITERATIONS_KEPT ones in
#: ``status.nodes``; the iterations between are folded, one record per node of the loop at
#: ``<id>#<first>-<last>`` (:func:`folded_range`), so a long loop leaves the FlowRun small.
ITERATIONS_KEPT = 10

#: The end of a folded record's key: ``#<first>-<last>``.
_FOLDED = re.compile(r"#(\d+)-(\d+)$")


def node_of_key(key: str) -> tuple[str, int]:
    """The top-level node of a ``status.nodes`` key and the loop iteration it records.

    Keys are the engine's (:meth:`agentflows.engine.state.Frame.key`): ``id``, ``id#2`` for
    iteration 2 of a node in a loop, ``id[3]`` for a map item, ``id#2/inner`` inside a sub-flow
    (node ids hold none of ``#[/``): ``review#2`` is ``("review", 2)``, ``plan`` ``("plan", 1)``.
    A folded record gives its first iteration (``review#2-990``: ``("review", 2)``).
    """
    head = key.split("/", 1)[0].split("[", 1)[0]
    node_id, _, iteration = head.partition("#")
    return node_id, int(iteration.split("-", 1)[0]) if iteration[:1].isdigit() else 1


def key_order(key: str) -> list[str | int]:
    """Sorts status keys by node, then iteration and item by number: ``review#2`` before ``#10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", key)]


def folded_range(key: str) -> tuple[str, int, int] | None:
    """``(node key, first, last)`` of a folded record's key (``review#2-990``), else None."""
    found = _FOLDED.search(key)
    if found is None or found.start() == 0:
        return None
    return key[: found.start()], int(found[1]), int(found[2])


def fold_holding(keys: Iterable[str], key: str) -> str | None:
    """The folded record among ``keys`` that holds iteration record ``key`` (``review#5``)."""
    base, _, iteration = key.rpartition("#")
    if not base or not iteration.isdigit():
        return None
    for candidate in keys:
        found = folded_range(candidate)
        if found is not None and found[0] == base and found[1] <= int(iteration) <= found[2]:
            return candidate
    return None


def latest_iteration(keys: Iterable[str], base: str) -> int:
    """The latest iteration recorded of node key ``base`` among ``keys`` (1: none past the first).

    ``base`` is a node's key without an iteration (``review``, ``call/inner``); its iterations
    are ``base#<n>`` and the folded records ``base#<first>-<last>``.
    """
    latest = 1
    for key in keys:
        if not key.startswith(base + "#"):
            continue
        rest = key[len(base) + 1 :]
        found = folded_range(key)
        if rest.isdigit():
            latest = max(latest, int(rest))
        elif found is not None and found[0] == base:
            latest = max(latest, found[2])
    return latest


#: Most bytes of JSON a run's ``spec.input`` may hold (compact JSON, as counted by
#: :func:`input_size_problem`). Every FlowRun is held in the operator's memory while it is
#: active, so an input over this is refused at ``agentflows start`` and fails the run at once
#: (reason InputTooLarge); larger data is passed by reference (a ConfigMap, a URL).
MAX_INPUT_BYTES = 262_144


def input_size_problem(value: Any, where: str = "spec.input") -> str | None:
    """Why ``value`` is too large to be a run's input (None when it is not)."""
    size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
    if size <= MAX_INPUT_BYTES:
        return None
    return (
        f"{where}: {size} bytes of JSON, over the {MAX_INPUT_BYTES} a run's input may hold; "
        "pass larger data by reference (a ConfigMap, a URL)"
    )


class RunReason(enum.StrEnum):
    """Why a run is in its phase: status.reason and the Succeeded condition's reason."""

    #: Created; no runner pod yet.
    PENDING = "Pending"
    #: Held back by the Flow's concurrency policy (Queue).
    QUEUED = "Queued"
    #: A runner attempt is starting (its pod is being created).
    ATTEMPT_STARTED = "AttemptStarted"
    #: The runner pod is created and not yet running.
    POD_PENDING = "PodPending"
    #: The runner pod could not be created; the operator tries again.
    POD_CREATE_FAILED = "PodCreateFailed"
    #: A runner executes nodes.
    RUNNING = "Running"
    #: A runner pod ended without a result; another attempt follows after a backoff.
    ATTEMPT_LOST = "AttemptLost"
    #: Every node finished; the output is set.
    SUCCEEDED = "Succeeded"
    #: Paused on human requests.
    WAITING = "Waiting"
    #: The run input does not match the Flow's input schema.
    INVALID_INPUT = "InvalidInput"
    #: The run took longer than limits.timeoutSeconds.
    TIMEOUT = "Timeout"
    #: A human rejected an approval or input request that no branch routes.
    REJECTED = "Rejected"
    #: A human request expired with onTimeout fail.
    REQUEST_EXPIRED = "RequestExpired"
    #: A node failed (after its retries, if any).
    NODE_FAILED = "NodeFailed"
    #: The run used more than limits.maxTokens.
    TOKEN_LIMIT_EXCEEDED = "TokenLimitExceeded"
    #: The run cost more than limits.maxCostUSD.
    COST_LIMIT_EXCEEDED = "CostLimitExceeded"
    #: A Budget of the namespace is used up: a new run is held or refused, a running one stops.
    BUDGET_EXCEEDED = "BudgetExceeded"
    #: The run executed more than limits.maxNodeExecutions nodes.
    NODE_EXECUTION_LIMIT_EXCEEDED = "NodeExecutionLimitExceeded"
    #: A loop would run more often than its re-entry node's maxIterations (or limits').
    LOOP_ITERATION_LIMIT_EXCEEDED = "LoopIterationLimitExceeded"
    #: spec.output could not be evaluated.
    OUTPUT_FAILED = "OutputFailed"
    #: The run's snapshot of its Flow and Agents is missing or unreadable.
    SNAPSHOT_MISSING = "SnapshotMissing"
    #: The Flow does not exist.
    FLOW_NOT_FOUND = "FlowNotFound"
    #: The Flow (or the snapshot of it) does not validate.
    FLOW_INVALID = "FlowInvalid"
    #: The run's spec.input is over MAX_INPUT_BYTES.
    INPUT_TOO_LARGE = "InputTooLarge"
    #: Stored state the run needs is malformed or gone (e.g. an offloaded output).
    STATE_LOST = "StateLost"
    #: A human node's (approval, input) record matches no decided or expired request of it:
    #: it was not written from a human's decision, and the run does not go past it.
    HUMAN_RECORD_UNDECIDED = "HumanRecordUndecided"
    #: A node waits for a request that is not in status.requests any more (it was deleted).
    REQUEST_MISSING = "RequestMissing"
    #: Runner pods were lost more often than spec.retry.maxAttempts allows.
    RETRIES_EXHAUSTED = "RetriesExhausted"
    #: The runner ended without saying how.
    RUN_FAILED = "RunFailed"
    #: spec.cancel was set.
    CANCELLED = "Cancelled"
    #: A local run (agentflows run) stopped by Ctrl-C: saved Pending, so resume continues it.
    INTERRUPTED = "Interrupted"
    #: Cancelled by the Flow's Forbid concurrency policy.
    CONCURRENCY_FORBID = "ConcurrencyForbid"

    @classmethod
    def known(cls, text: str | None) -> RunReason | None:
        """The reason spelled ``text``; None for no text or one this version does not name."""
        try:
            return cls(text) if text else None
        except ValueError:
            return None


class NodePhase(enum.StrEnum):
    """Where a node is in its life."""

    #: Started, not finished (a runner that stops here re-runs the node).
    RUNNING = "Running"
    #: Paused on a human request.
    WAITING = "Waiting"
    #: Finished with an output.
    SUCCEEDED = "Succeeded"
    #: Finished with an error.
    FAILED = "Failed"
    #: Not taken: every path to it was cut by a branch.
    SKIPPED = "Skipped"


class RequestKind(enum.StrEnum):
    """What a human request asks for."""

    APPROVAL = "approval"
    REVIEW = "review"
    INPUT = "input"
    TOOL = "tool"


class Decision(enum.StrEnum):
    """A human's answer to a request."""

    APPROVE = "approve"
    REJECT = "reject"
    EDIT = "edit"
    RESPOND = "respond"


#: Decisions each kind of request takes: the operator takes back any other, the CLI offers these.
DECISIONS: dict[str, frozenset[Decision]] = {
    RequestKind.APPROVAL: frozenset({Decision.APPROVE, Decision.REJECT, Decision.EDIT}),
    RequestKind.INPUT: frozenset({Decision.RESPOND, Decision.REJECT}),
    RequestKind.REVIEW: frozenset(Decision),
    RequestKind.TOOL: frozenset(Decision),
}


class TriggerRef(common.ApiModel):
    """What started the run (set by triggers)."""

    type: Literal["manual", "schedule", "webhook", "kubernetes"] = Field(
        default="manual", description="Kind of trigger."
    )
    name: str | None = Field(default=None, max_length=63, description="Trigger name in the Flow.")
    payload: common.JsonValue = Field(default=None, description="What the trigger received.")


class FlowRunSpec(common.ApiModel):
    """Desired state of a FlowRun."""

    flow: common.ObjectName = Field(description="Name of the Flow to run (same namespace).")
    input: common.JsonValue = Field(
        default=None,
        description="Run input (the Flow's schema); at most 262144 bytes of JSON, or the run "
        "fails with reason InputTooLarge.",
    )
    trigger: TriggerRef | None = Field(default=None, description="What started the run.")
    cancel: bool = Field(default=False, description="Set true to cancel the run.")


class NodeStatus(common.ApiModel):
    """The durable record of one node."""

    phase: NodePhase = Field(description="Running, Waiting, Succeeded, Failed or Skipped.")
    started_at: str | None = Field(default=None, description="RFC 3339 start time.")
    finished_at: str | None = Field(default=None, description="RFC 3339 finish time.")
    attempts: int = Field(default=0, ge=0, description="Times the node was started.")
    attempt_errors: list[Annotated[str, StringConstraints(max_length=MAX_ATTEMPT_ERROR_CHARS)]] = (
        Field(
            default_factory=list,
            max_length=MAX_ATTEMPT_ERRORS,
            description="Errors of earlier attempts that were retried, oldest first (the last "
            f"{MAX_ATTEMPT_ERRORS}, each cut to {MAX_ATTEMPT_ERROR_CHARS} characters).",
        )
    )
    output: common.JsonValue = Field(default=None, description="The node's output (bounded).")
    output_ref: str | None = Field(
        default=None, description="Where a large output was offloaded (ConfigMap or file)."
    )
    usage: common.Usage | None = Field(default=None, description="Tokens, cost and calls.")
    error: str | None = Field(default=None, max_length=32768, description="Why it failed.")
    detail: common.JsonValue = Field(
        default=None, description="Kind-specific record: tool calls, compressions, paused state."
    )


class HumanRequest(common.ApiModel):
    """A question to a human. The runner writes the question; a human writes the decision."""

    node: str = Field(description="Node that asked.")
    kind: RequestKind = Field(description="approval, review, input or tool.")
    message: str = Field(default="", description="What is asked.")
    summary: str = Field(default="", description="Context for the decision.")
    schema_: common.JsonValue = Field(
        default=None, alias="schema", description="JSON Schema of the expected data (input)."
    )
    proposal: common.JsonValue = Field(
        default=None, description="The proposed action (review and tool requests)."
    )
    approvers: common.Approvers = Field(
        default_factory=common.Approvers, description="Who may decide."
    )
    requested_at: str | None = Field(default=None, description="RFC 3339 time of the request.")
    expires_at: str | None = Field(default=None, description="RFC 3339 expiry time.")
    on_timeout: str | None = Field(default=None, description="reject or fail on expiry.")
    decision: Decision | None = Field(
        default=None, description="approve, reject, edit or respond (written by a human)."
    )
    edits: common.JsonValue = Field(default=None, description="Replacement arguments (edit).")
    data: common.JsonValue = Field(default=None, description="Answer to an input request.")
    comment: str | None = Field(default=None, max_length=8192, description="Decider's comment.")
    decided_by: str | None = Field(default=None, description="User name of the decider.")
    decided_at: str | None = Field(default=None, description="RFC 3339 decision time.")
    error: str | None = Field(
        default=None, description="Why a decision was not accepted (the run keeps waiting)."
    )


#: The phases an attempt of the runner ends in (a run's other phases are the operator's).
RESULT_PHASES = (RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.WAITING)


class RunnerResult(common.ApiModel):
    """How the runner's attempt ended, written by the runner; the operator derives the phase."""

    attempt: int = Field(ge=0, description="The attempt this result belongs to.")
    phase: RunPhase = Field(
        description="Succeeded, Failed (permanently: not retried) or Waiting (for a human).",
        # the CRD's enum: only these, as the validator below holds the model to
        json_schema_extra={"enum": [p.value for p in RESULT_PHASES]},
    )
    reason: str | None = Field(default=None, max_length=256, description="CamelCase reason.")
    message: str | None = Field(default=None, max_length=32768, description="Why it ended so.")
    finished_at: str | None = Field(default=None, description="RFC 3339 time the runner ended.")

    @field_validator("phase")
    @classmethod
    def _an_attempts_end(cls, phase: RunPhase) -> RunPhase:
        if phase not in RESULT_PHASES:
            ends = ", ".join(p.value for p in RESULT_PHASES)
            raise ValueError(f"{phase.value} is not how an attempt ends: one of {ends}")
        return phase


class FlowRunStatus(common.ApiModel):
    """Observed state of a FlowRun: the run's durable memory."""

    observed_generation: int | None = Field(
        default=None, description="Generation the status was computed from."
    )
    phase: RunPhase | None = Field(default=None, description="Where the run is.")
    conditions: list[common.Condition] = Field(
        default_factory=list,
        description="Succeeded (Unknown/True/False) and Waiting.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )
    start_time: str | None = Field(default=None, description="RFC 3339 start time.")
    completion_time: str | None = Field(default=None, description="RFC 3339 completion time.")
    duration: str | None = Field(
        default=None, description="Run time so far or in total, e.g. 1m23s (for kubectl get)."
    )
    attempt: int = Field(default=0, ge=0, description="Runner attempt number.")
    pod: str | None = Field(default=None, description="Name of the current runner pod.")
    pod_created: int = Field(
        default=0,
        ge=0,
        le=common.INT_MAX,
        description=(
            "The highest attempt whose runner pod the operator created: a missing pod of an "
            "attempt up to it was lost, and is never created again."
        ),
    )
    attempts_lost: int = Field(
        default=0,
        ge=0,
        le=common.INT_MAX,
        description=(
            "Runner attempts lost (the pod gone, killed, or ended without a result); with the "
            "first attempt they count against the Flow's retry.maxAttempts. An attempt that "
            "ends because the run waits for a human, and the one its decision starts, do not."
        ),
    )
    current_node: str | None = Field(default=None, description="A node that is running now.")
    nodes: dict[str, NodeStatus] = Field(
        default_factory=dict, description="Node id -> its durable record."
    )
    requests: dict[str, HumanRequest] = Field(
        default_factory=dict, description="Request id -> the human request."
    )
    output: common.JsonValue = Field(default=None, description="Run output (bounded).")
    output_ref: str | None = Field(default=None, description="Where a large output went.")
    usage: common.Usage | None = Field(default=None, description="Usage over the whole run.")
    budget_charged: common.Usage | None = Field(
        default=None,
        description="The part of usage the operator has charged to the namespace's Budgets.",
    )
    snapshot_digest: str | None = Field(
        default=None,
        max_length=80,
        description=(
            "sha256:<hex> of the run's snapshot as the operator wrote it (ConfigMap "
            "<run>-snapshot); a snapshot with another content is not the run's."
        ),
    )
    result: RunnerResult | None = Field(
        default=None, description="How the latest runner attempt ended (written by the runner)."
    )
    message: str | None = Field(default=None, max_length=32768, description="Why it ended so.")
    reason: str | None = Field(default=None, description="CamelCase reason of the end.")


class FlowRun(common.ApiModel):
    """One execution of a Flow."""

    api_version: Literal["agentflows.io/v1alpha1"] = Field(
        default="agentflows.io/v1alpha1", description="agentflows.io/v1alpha1"
    )
    kind: Literal["FlowRun"] = Field(default="FlowRun", description="FlowRun")
    metadata: common.ObjectMeta = Field(
        default_factory=common.ObjectMeta, description="Object metadata."
    )
    spec: FlowRunSpec = Field(description="Desired state.")
    status: FlowRunStatus | None = Field(default=None, description="Observed state.")


def status_of(run: Mapping[str, Any]) -> FlowRunStatus:
    """The status of a FlowRun object, parsed once: what every reader of a run's state reads.

    ``run`` is a FlowRun as the API server returns it, or the one a local run's files make
    (:mod:`agentflows.cli.local_runs`); no status yet is an empty one. Keys this version does
    not define are ignored, not refused (the models refuse them in what a user writes): a run
    written by an operator or runner of a newer version still reads. A value of the wrong type
    raises :class:`pydantic.ValidationError`, which the API server's schema keeps from a stored
    run.
    """
    return FlowRunStatus.model_validate(run.get("status") or {}, extra="ignore")

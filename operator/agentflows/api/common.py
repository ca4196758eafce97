"""Types shared by the three resources: the model base, object metadata, conditions, refs.

Every field carries a description, because descriptions become ``kubectl explain`` text.
Free-form JSON leaves are marked with ``FREE_FORM`` so the CRD generator emits
``x-kubernetes-preserve-unknown-fields`` for them and nowhere else.
"""

from __future__ import annotations

import json
import re
import threading
import typing
from collections.abc import Iterator
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

#: Marker for genuinely free-form JSON leaves (inputs, outputs, schemas, arguments).
FREE_FORM: dict[str, Any] = {"x-kubernetes-preserve-unknown-fields": True}

#: Names of Kubernetes objects (a DNS-1123 subdomain: dot-separated labels of lower-case
#: letters, digits and "-"), as the API server requires of ``metadata.name``.
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
NAME_MAX = 253
#: A Flow's name is also a label value on its runs and CronJobs, which holds 63 characters.
FLOW_NAME_MAX = 63
#: The bound of counters without a smaller one: the largest integer a float64 holds exactly.
#: Not int64's 2**63 - 1: the API server reads a CRD's ``maximum`` as a float64, where that
#: rounds up to 2**63, overflows to the int64 minimum, and then refuses every value.
INT_MAX = 2**53 - 1
#: Ids of nodes, requests and triggers: short, safe as label values and map keys.
ID_PATTERN = r"^[a-z0-9]([-a-z0-9_]*[a-z0-9])?$"

ObjectName = Annotated[str, Field(min_length=1, max_length=NAME_MAX, pattern=NAME_PATTERN)]
Identifier = Annotated[str, Field(min_length=1, max_length=63, pattern=ID_PATTERN)]
JsonValue = Annotated[Any, Field(json_schema_extra=FREE_FORM)]


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError(
            "must not contain a NUL character (\\0): the operating system ends a path, "
            "a command's argument or an environment value at one"
        )
    return value


#: Text the operating system receives: a file path, a command, its arguments, environment.
OsText = Annotated[str, AfterValidator(_no_nul)]


#: Variables of the runner pod that only the operator sets (``AGENTFLOWS_ATTEMPT``,
#: ``AGENTFLOWS_BUDGET``, ``AGENTFLOWS_SECRET_*``...): a Flow or Agent may not set any, or a
#: run could empty its own budget or stand in for a secret.
OPERATOR_ENV_PREFIX = "AGENTFLOWS_"
#: The same rule for the CRDs (CEL), so the API server refuses what the models refuse.
OPERATOR_ENV_CEL = f"!{{name}}.startsWith('{OPERATOR_ENV_PREFIX}')"


def operator_env_problem(name: str) -> str | None:
    """Why a Flow or Agent may not set the variable ``name`` (None: it may)."""
    if name.startswith(OPERATOR_ENV_PREFIX):
        return (
            f"{name!r}: variables starting with {OPERATOR_ENV_PREFIX} are set by the operator "
            "and cannot be set by a Flow or Agent; choose another name"
        )
    return None


def operator_env_message(field: str) -> str:
    """The CRD's message for a variable of the operator's set in ``field``."""
    return (
        f"{field}: variables starting with {OPERATOR_ENV_PREFIX} are set by the operator and "
        "cannot be set by a Flow or Agent; choose another name"
    )


def name_problem(name: Any, max_length: int = NAME_MAX) -> str | None:
    """Why ``name`` is not a valid object name (None when it is), in the API server's terms."""
    if name is None or name == "":
        return "required: set the object's name"
    if not isinstance(name, str):
        return f"must be a string (got {json.dumps(name)[:40]})"
    if len(name) <= max_length and re.fullmatch(NAME_PATTERN, name):
        return None
    shown = json.dumps(name[:60] + ("..." if len(name) > 60 else ""), ensure_ascii=False)
    return (
        f'{shown} is not a valid name: lower-case letters, digits, "-" and ".", starting and'
        f" ending with a letter or digit, at most {max_length} characters"
    )


class ApiModel(BaseModel):
    """Base of every API model: camelCase on the wire, unknown fields rejected.

    Floats are finite: JSON (and so the API server) has no infinity or NaN. Documents a user
    writes are validated in strict mode by :mod:`agentflows.api.documents`, as the API server
    checks types: ``"4"`` is not an integer there.

    A model's validator is built when it is first used, not when its class is defined
    (``defer_build``): importing the API costs no schema building, and a command builds only
    what it validates. ``agentflows run`` of a Flow with no Agent never builds the Agent models,
    nor the FlowRun's or a session's (issue 25: start -> first node).
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        serialize_by_alias=True,
        allow_inf_nan=False,
        defer_build=True,
    )

    def to_wire(self) -> dict[str, Any]:
        """Return the JSON form as written in YAML, without unset optional fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    @classmethod
    def model_rebuild(
        cls,
        *,
        force: bool = False,
        raise_errors: bool = True,
        _parent_namespace_depth: int = 2,
        _types_namespace: Any = None,
    ) -> bool | None:
        """Build the models of this model's fields first, then this one, which reuses them.

        pydantic builds a deferred model (on its first use) by generating the schemas of the
        models it contains inline, without keeping them on those models: each of them, used
        on its own later (a FlowSpec inside Flow, then FlowSpec alone), is generated again. A
        model whose fields' models are built already takes their schemas as they are, so each
        model's schema is generated once (issue 25: ``agentflows run`` builds 4 outer models
        instead of 10 before its first node). A model being built is not built again from
        inside (recursive models).
        """
        if not force and cls.__pydantic_complete__:
            return None
        building = _BUILDING.models
        if cls not in building:
            building.add(cls)
            try:
                for model in _field_models(cls):
                    if not model.__pydantic_complete__ and model not in building:
                        model.model_rebuild(raise_errors=False)
            finally:
                building.discard(cls)
        return super().model_rebuild(
            force=force,
            raise_errors=raise_errors,
            _parent_namespace_depth=_parent_namespace_depth + 1,
            _types_namespace=_types_namespace,
        )


class _Building(threading.local):
    """The models whose fields' models this thread is building (:meth:`ApiModel.model_rebuild`).

    A guard against recursion (a model that contains itself), so it belongs to one thread's
    stack: models are built on first use, which may be in a worker thread
    (``asyncio.to_thread``) while another thread builds. With one set shared, a thread would
    take a model another thread is building for its own recursion and skip building it, and
    its fields' models, first: their schemas would be generated again (the cost issue 25
    removed). A lock would also serialize builds that do not touch each other.
    """

    def __init__(self) -> None:
        self.models: set[type[BaseModel]] = set()


_BUILDING = _Building()


def _field_models(cls: type[BaseModel]) -> Iterator[type[ApiModel]]:
    """The API models named in ``cls``'s field types (inside lists, maps, unions, Annotated)."""
    pending: list[Any] = [field.annotation for field in cls.model_fields.values()]
    seen: set[int] = set()
    while pending:
        kind = pending.pop()
        if id(kind) in seen:
            continue
        seen.add(id(kind))
        if isinstance(kind, type) and issubclass(kind, ApiModel):
            yield kind
        pending.extend(typing.get_args(kind))


class ObjectMeta(BaseModel):
    """The subset of Kubernetes object metadata agentflows reads; other keys are kept."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="allow",
        serialize_by_alias=True,
        defer_build=True,  # as ApiModel's
    )

    name: str | None = Field(default=None, description="Name of the object.")
    generate_name: str | None = Field(
        default=None, description="Prefix for a server-generated name."
    )
    namespace: str | None = Field(default=None, description="Namespace of the object.")
    labels: dict[str, str] = Field(default_factory=dict, description="Object labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Object annotations.")
    uid: str | None = Field(default=None, description="Server-assigned unique id.")
    generation: int | None = Field(default=None, description="Spec generation.")
    resource_version: str | None = Field(default=None, description="Optimistic-lock version.")


class SecretKeySelector(ApiModel):
    """One key of a Secret in the resource's namespace; the value is never read by the operator."""

    name: ObjectName = Field(description="Name of the Secret.")
    key: str = Field(min_length=1, max_length=253, description="Key within the Secret.")


class SecretKeyRef(ApiModel):
    """A reference to a secret value, mounted in the runner pod as a file of its secrets volume."""

    secret_key_ref: SecretKeySelector = Field(description="The Secret and key holding the value.")


def pointer_escape(part: str) -> str:
    """One reference token of a JSON pointer (RFC 6901): ``~`` as ``~0``, ``/`` as ``~1``."""
    return part.replace("~", "~0").replace("/", "~1")


def pointer_unescape(part: str) -> str:
    """The text of one reference token of a JSON pointer: the inverse of :func:`pointer_escape`."""
    return part.replace("~1", "/").replace("~0", "~")


def json_pointer(*parts: str) -> str:
    """The JSON pointer to ``parts`` (``json_pointer("status", "requests", "a/b")``)."""
    return "".join(f"/{pointer_escape(part)}" for part in parts)


def wire_name(model: type[BaseModel], field: str) -> str:
    """The camelCase key a model's field has on the wire (``decided_by`` -> ``decidedBy``)."""
    return model.model_fields[field].alias or field


class Condition(ApiModel):
    """A ``metav1.Condition``: the standard shape kstatus, Argo CD and Flux understand."""

    type: str = Field(max_length=316, description="Condition type, e.g. Ready or Succeeded.")
    status: str = Field(pattern=r"^(True|False|Unknown)$", description="True, False or Unknown.")
    observed_generation: int | None = Field(
        default=None,
        ge=0,
        le=INT_MAX,
        description="The metadata.generation the condition was set from.",
    )
    last_transition_time: str = Field(
        description="RFC 3339 time the status last changed.",
        json_schema_extra={"format": "date-time"},
    )
    reason: str = Field(
        max_length=1024,
        pattern=r"^([A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?)?$",
        description="CamelCase machine-readable reason for the last transition.",
    )
    message: str = Field(
        default="", max_length=32768, description="Human-readable detail of the last transition."
    )


def condition_of(conditions: list[dict[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    """The condition of that type in a status's wire ``conditions`` list, or None."""
    return next((c for c in conditions or [] if c.get("type") == type_), None)


class Approvers(ApiModel):
    """Who may decide a human request; empty means anyone allowed to patch flowruns/status."""

    users: list[str] = Field(default_factory=list, description="User names allowed to decide.")
    groups: list[str] = Field(default_factory=list, description="Groups whose members may decide.")


class Usage(ApiModel):
    """Model and tool usage, per node and for the whole run."""

    prompt_tokens: int = Field(default=0, ge=0, le=INT_MAX, description="Prompt (input) tokens.")
    completion_tokens: int = Field(
        default=0, ge=0, le=INT_MAX, description="Completion (output) tokens."
    )
    cost_usd: float = Field(
        default=0.0, ge=0, alias="costUSD", description="Cost in US dollars (litellm's table)."
    )
    llm_calls: int = Field(default=0, ge=0, le=INT_MAX, description="Model calls made.")
    tool_calls: int = Field(default=0, ge=0, le=INT_MAX, description="Tool calls made.")

    def add(self, other: Usage) -> Usage:
        """Return the sum of two usages."""
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            cost_usd=round(self.cost_usd + other.cost_usd, 10),
            llm_calls=self.llm_calls + other.llm_calls,
            tool_calls=self.tool_calls + other.tool_calls,
        )

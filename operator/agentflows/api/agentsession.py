"""The AgentSession resource: one persisted session of an agent memory, on the cluster.

Written by the runner (:mod:`agentflows.kube.session_store`) after each agent turn with a
``session``, read before the next one, listed and deleted with ``agentflows sessions`` or
``kubectl get agentsessions``. One object holds every conversation of one session: the one
without a request id and one per request id (parallel calls of a ``map``). It is owned by the
Agent that first wrote it, so deleting the Agent deletes its sessions.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agentflows.api import common


class Conversation(common.ApiModel):
    """One conversation of a session: its messages as sent to the model, secrets redacted."""

    request: str | None = Field(
        default=None, max_length=4096, description="Request id; absent for the session's own."
    )
    messages: common.JsonValue = Field(
        default_factory=list,
        description="Messages after the system prompt (user, assistant, tool; summaries): the "
        "list of chat messages as sent to the model.",
    )
    turns: int = Field(default=0, ge=0, le=common.INT_MAX, description="Turns saved so far.")
    compactions: int = Field(
        default=0, ge=0, le=common.INT_MAX, description="Times it was compacted to fit."
    )
    updated_at: str = Field(default="", description="When the last turn was saved (RFC 3339).")


class AgentSessionSpec(common.ApiModel):
    """What the session holds."""

    memory: common.ObjectName = Field(
        description="The memory: an Agent's name, or the shared name its agents use."
    )
    session: str = Field(min_length=1, max_length=4096, description="The session, as evaluated.")
    agent: common.ObjectName = Field(description="The Agent that first wrote the session.")
    updated_at: str = Field(default="", description="When a turn was last saved (RFC 3339).")
    turns: int = Field(default=0, ge=0, le=common.INT_MAX, description="Turns saved in total.")
    conversations: list[Conversation] = Field(
        default_factory=list, description="The session's conversations, one per request id."
    )


class AgentSession(common.ApiModel):
    """A persisted agent session (written by runners; deletable per session)."""

    api_version: Literal["agentflows.io/v1alpha1"] = Field(
        default="agentflows.io/v1alpha1", description="agentflows.io/v1alpha1"
    )
    kind: Literal["AgentSession"] = Field(default="AgentSession", description="AgentSession")
    metadata: common.ObjectMeta = Field(
        default_factory=common.ObjectMeta, description="Standard object metadata."
    )
    spec: AgentSessionSpec = Field(description="The session's conversations.")

"""The Budget resource: what a namespace's runs may spend per UTC day and month.

A platform team writes a Budget in a namespace (the chart lets namespace users read Budgets and
only admins write them); every FlowRun of that namespace is charged against every Budget there.
The operator writes the status (usage per window, from what runs report in ``status.usage``);
nobody else does. Why a namespaced resource rather than a ConfigMap: the schema is validated by
the API server (a typo is refused, not ignored), ``kubectl get budgets`` shows usage against the
limits, ``kubectl explain`` documents it, and RBAC can separate who reads it from who writes it
without granting access to every ConfigMap of the namespace.

:class:`RunBudget` is what the operator hands a runner pod (``$AGENTFLOWS_BUDGET``): the tokens
and dollars the run may use in total, so the engine stops it as ``limits.maxTokens`` would.
"""

from __future__ import annotations

import enum
from typing import Literal

from pydantic import Field

from agentflows.api import common

#: The variable holding a runner pod's :class:`RunBudget` (JSON), set by the operator.
RUN_BUDGET_ENV = "AGENTFLOWS_BUDGET"


class Window(enum.StrEnum):
    """A budget period, in UTC: a calendar day or a calendar month."""

    DAY = "day"
    MONTH = "month"


class Policy(enum.StrEnum):
    """What happens to a new run while a Budget of its namespace is used up."""

    #: The run stays Pending (condition BudgetExceeded) and starts once the window rolls
    #: over or the Budget is raised.
    HOLD = "Hold"
    #: The run fails at once with reason BudgetExceeded.
    REFUSE = "Refuse"


class Limit(common.ApiModel):
    """What one window allows; an omitted figure is not limited."""

    tokens: int | None = Field(
        default=None, ge=1, le=common.INT_MAX, description="Prompt plus completion tokens."
    )
    cost_usd: float | None = Field(
        default=None, gt=0, le=1_000_000_000, alias="costUSD", description="Model cost, USD."
    )


class BudgetSpec(common.ApiModel):
    """Limits on the model usage of every FlowRun in the namespace."""

    day: Limit | None = Field(default=None, description="Per UTC calendar day.")
    month: Limit | None = Field(default=None, description="Per UTC calendar month.")
    policy: Policy = Field(
        default=Policy.HOLD,
        description="New runs while the budget is used up: Hold (stay Pending) or Refuse (fail).",
    )

    def limit(self, window: Window) -> Limit | None:
        """The limit of one window."""
        return self.day if window is Window.DAY else self.month


class WindowUsage(common.ApiModel):
    """What the namespace's runs used in the current window."""

    start: str = Field(description="RFC 3339 start of the window (UTC midnight).")
    tokens: int = Field(default=0, ge=0, description="Tokens used in the window.")
    cost_usd: float = Field(default=0.0, ge=0, alias="costUSD", description="USD used.")
    used: str | None = Field(
        default=None, description="Used of the limit in words, for kubectl get (e.g. 520/500 tok)."
    )


class BudgetStatus(common.ApiModel):
    """Usage per window, written by the operator."""

    observed_generation: int | None = Field(
        default=None, description="Generation the status was computed from."
    )
    day: WindowUsage | None = Field(default=None, description="The current UTC day.")
    month: WindowUsage | None = Field(default=None, description="The current UTC month.")
    exceeded: str | None = Field(
        default=None, description="The windows whose limit is reached now (day, month), if any."
    )

    def usage(self, window: Window) -> WindowUsage | None:
        """The stored usage of one window."""
        return self.day if window is Window.DAY else self.month


class Budget(common.ApiModel):
    """Per-namespace limits on what FlowRuns may spend, per UTC day and month."""

    api_version: Literal["agentflows.io/v1alpha1"] = Field(
        default="agentflows.io/v1alpha1", description="agentflows.io/v1alpha1"
    )
    kind: Literal["Budget"] = Field(default="Budget", description="Budget")
    metadata: common.ObjectMeta = Field(
        default_factory=common.ObjectMeta, description="Object metadata."
    )
    spec: BudgetSpec = Field(description="Desired state.")
    status: BudgetStatus | None = Field(default=None, description="Observed state.")


class RunBudget(common.ApiModel):
    """The most a run may use in total (earlier attempts included) under its namespace's Budgets.

    Set by the operator when it starts an attempt: what the run had used when it was last
    charged, plus what the tightest Budget window has left.
    """

    max_tokens: int | None = Field(default=None, ge=0, description="Tokens over the whole run.")
    tokens_by: str = Field(default="", description="The Budget window setting it: team/day.")
    max_cost_usd: float | None = Field(
        default=None, ge=0, alias="maxCostUSD", description="USD over the whole run."
    )
    cost_by: str = Field(default="", description="The Budget window setting it: team/month.")

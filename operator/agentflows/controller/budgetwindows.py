"""Budget arithmetic: UTC windows, charging usage, what is exceeded and what is left.

Pure functions of a Budget's spec and status and ``now`` (the caller's clock, so tests pass any
time); :mod:`agentflows.controller.budgets` reads and writes the objects. A window's stored
usage counts only while its ``start`` is the start of the window ``now`` falls in: a day's usage
from yesterday reads as zero today, and the next charge starts the window again from zero.
A window is exceeded when its usage has reached a limit (``used >= limit``): a run that would
only just fit is not started, since it would use something.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from agentflows.api import budget as budget_api
from agentflows.api import common, times

WINDOWS = (budget_api.Window.DAY, budget_api.Window.MONTH)


def window_start(window: budget_api.Window, now: dt.datetime) -> dt.datetime:
    """The start (UTC midnight) of the window ``now`` falls in."""
    day = now.astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return day if window is budget_api.Window.DAY else day.replace(day=1)


def next_start(window: budget_api.Window, now: dt.datetime) -> dt.datetime:
    """When the window after the one ``now`` falls in starts."""
    start = window_start(window, now)
    if window is budget_api.Window.DAY:
        return start + dt.timedelta(days=1)
    return (start + dt.timedelta(days=32)).replace(day=1)


def current(
    status: budget_api.BudgetStatus | None, window: budget_api.Window, now: dt.datetime
) -> budget_api.WindowUsage:
    """The usage of the window ``now`` falls in (zero when the stored one is older)."""
    start = times.api_time(window_start(window, now))
    stored = status.usage(window) if status is not None else None
    if stored is not None and stored.start == start:
        return stored
    return budget_api.WindowUsage(start=start)


def _tokens(usage: common.Usage) -> int:
    return usage.prompt_tokens + usage.completion_tokens


def _used_text(usage: budget_api.WindowUsage, limit: budget_api.Limit | None) -> str:
    """``520/500 tokens, $0.0031/$1`` (a figure without a limit has no ``/limit``)."""
    tokens = f"{usage.tokens}"
    cost = f"${usage.cost_usd:.4f}"
    if limit is not None and limit.tokens is not None:
        tokens += f"/{limit.tokens}"
    if limit is not None and limit.cost_usd is not None:
        cost += f"/${limit.cost_usd:g}"
    return f"{tokens} tokens, {cost}"


def is_exceeded(usage: budget_api.WindowUsage, limit: budget_api.Limit | None) -> bool:
    """True when a window's usage has reached one of its limits."""
    if limit is None:
        return False
    over_tokens = limit.tokens is not None and usage.tokens >= limit.tokens
    over_cost = limit.cost_usd is not None and usage.cost_usd >= limit.cost_usd
    return over_tokens or over_cost


def status_at(
    spec: budget_api.BudgetSpec,
    status: budget_api.BudgetStatus | None,
    now: dt.datetime,
    charge: common.Usage | None = None,
    generation: int | None = None,
) -> budget_api.BudgetStatus:
    """The status as of ``now``: windows rolled over, ``charge`` added, the texts recomputed."""
    windows: dict[str, budget_api.WindowUsage] = {}
    exceeded = []
    for window in WINDOWS:
        usage = current(status, window, now)
        if charge is not None:
            usage = usage.model_copy(
                update={
                    "tokens": usage.tokens + _tokens(charge),
                    "cost_usd": round(usage.cost_usd + charge.cost_usd, 10),
                }
            )
        limit = spec.limit(window)
        windows[window.value] = usage.model_copy(update={"used": _used_text(usage, limit)})
        if is_exceeded(usage, limit):
            exceeded.append(window.value)
    return budget_api.BudgetStatus(
        observed_generation=generation,
        day=windows["day"],
        month=windows["month"],
        exceeded=", ".join(exceeded) or None,
    )


@dataclasses.dataclass(frozen=True)
class Exceeded:
    """One Budget window that is used up."""

    budget: str
    window: budget_api.Window
    usage: budget_api.WindowUsage
    limit: budget_api.Limit
    policy: budget_api.Policy
    #: When the window rolls over (and the run may start).
    until: dt.datetime

    def message(self) -> str:
        """Budget, window and figures in words."""
        return (
            f"Budget {self.budget} is used up for the {self.window.value} starting "
            f"{self.usage.start}: {_used_text(self.usage, self.limit)}; "
            f"the window rolls over at {times.api_time(self.until)}"
        )


def exceeded(
    name: str,
    spec: budget_api.BudgetSpec,
    status: budget_api.BudgetStatus | None,
    now: dt.datetime,
) -> list[Exceeded]:
    """The Budget's windows that are used up ``now``."""
    found = []
    for window in WINDOWS:
        limit = spec.limit(window)
        usage = current(status, window, now)
        if limit is not None and is_exceeded(usage, limit):
            until = next_start(window, now)
            found.append(Exceeded(name, window, usage, limit, spec.policy, until))
    return found


def left(
    name: str,
    spec: budget_api.BudgetSpec,
    status: budget_api.BudgetStatus | None,
    now: dt.datetime,
) -> budget_api.RunBudget:
    """What the Budget's tightest windows leave ``now`` (tokens and USD, each named by window)."""
    result = budget_api.RunBudget()
    for window in WINDOWS:
        limit = spec.limit(window)
        if limit is None:
            continue
        usage = current(status, window, now)
        by = f"{name}/{window.value}"
        result = tighter(
            result,
            budget_api.RunBudget(
                max_tokens=None if limit.tokens is None else max(limit.tokens - usage.tokens, 0),
                tokens_by=by,
                max_cost_usd=None
                if limit.cost_usd is None
                else max(round(limit.cost_usd - usage.cost_usd, 10), 0.0),
                cost_by=by,
            ),
        )
    return result


def tighter(a: budget_api.RunBudget, b: budget_api.RunBudget) -> budget_api.RunBudget:
    """The smaller of two allowances, figure by figure."""
    tokens = min(
        ((x.max_tokens, x.tokens_by) for x in (a, b) if x.max_tokens is not None),
        default=(None, ""),
    )
    cost = min(
        ((x.max_cost_usd, x.cost_by) for x in (a, b) if x.max_cost_usd is not None),
        default=(None, ""),
    )
    return budget_api.RunBudget(
        max_tokens=tokens[0], tokens_by=tokens[1], max_cost_usd=cost[0], cost_by=cost[1]
    )


def for_run(allowance: budget_api.RunBudget, charged: common.Usage) -> budget_api.RunBudget:
    """A run's total cap: what it was charged already plus what the Budgets leave."""
    return allowance.model_copy(
        update={
            "max_tokens": None
            if allowance.max_tokens is None
            else allowance.max_tokens + _tokens(charged),
            "max_cost_usd": None
            if allowance.max_cost_usd is None
            else round(allowance.max_cost_usd + charged.cost_usd, 10),
        }
    )


def charged_after(charged: common.Usage, total: common.Usage) -> common.Usage:
    """What a run has been charged once ``total`` is charged: never less than before.

    ``total`` is the runner's ``status.usage``; a lower one (a tool holding the runner's
    identity rewrote it) charges nothing and leaves the charge where it was, so what a Budget
    counted is never taken back.
    """
    return charged.add(delta(total, charged))


def delta(total: common.Usage, charged: common.Usage) -> common.Usage:
    """What ``total`` has that ``charged`` does not (never negative)."""
    return common.Usage(
        prompt_tokens=max(total.prompt_tokens - charged.prompt_tokens, 0),
        completion_tokens=max(total.completion_tokens - charged.completion_tokens, 0),
        cost_usd=max(round(total.cost_usd - charged.cost_usd, 10), 0.0),
    )

"""Per-namespace Budgets in the operator: charging usage, holding new runs, capping running ones.

- Charging (:func:`charge`, from :mod:`flowruns` when an attempt's result arrives): the run's
  ``status.usage`` (its whole usage, earlier attempts included) minus ``status.budgetCharged``
  is added to every Budget of the namespace (a merge patch of the Budget's status with its
  ``resourceVersion``; a conflict reads it again and retries), then ``budgetCharged`` goes with
  the run's next status write. An operator stopped between the two writes charges that attempt
  again when it restarts: a budget errs on the side of counting too much.
- New runs (:func:`over`, from :mod:`admission` before the concurrency policy): a namespace
  whose Budget has a used-up window holds the run Pending (:func:`hold`: condition and reason
  BudgetExceeded, a Warning Event) until the window rolls over or the Budget changes, or
  refuses it (policy Refuse: Failed, reason BudgetExceeded).
- Running runs (:func:`run_cap`, from :mod:`attempts` for each pod): ``$AGENTFLOWS_BUDGET``
  tells the runner what the tightest window leaves, added to what the run was charged, and the
  engine enforces it as it enforces ``limits.maxTokens`` (reason BudgetExceeded). Runs started
  side by side each get what is left then: together they may pass the limit by what they use
  at once.
- Budget keys (:func:`reconcile`): windows rolled over at UTC midnight (the status written),
  the gauges ``agentflows_budget_{used,limit}_{usd,tokens}{namespace,budget,window}`` set, and,
  when the Budget changed, is gone or rolled over, the namespace's runs that have not started
  looked at again (a raised Budget releases them at once).
"""

from __future__ import annotations

import logging

from agentflows.api import budget as budget_api
from agentflows.api import common, retry, times
from agentflows.api.flowrun import RunPhase, RunReason
from agentflows.controller import budgetwindows as windows
from agentflows.controller import context, events, runstate
from agentflows.controller.runtime import workqueue
from agentflows.kube import client as kube

log = logging.getLogger(__name__)

#: The FlowRun condition saying a Budget holds the run.
HELD = "BudgetExceeded"
#: Tries of a Budget status write that meets a newer version: each again at once, after a
#: re-read (the fresh version is the remedy; waiting would add nothing).
_CONFLICT_BACKOFF = retry.Backoff(initial=0.0, attempts=5)


def _name(budget: budget_api.Budget) -> str:
    return str(budget.metadata.name)


def over(ctl: context.Controller, run: runstate.RunContext) -> list[windows.Exceeded]:
    """The namespace's used-up Budget windows; none: a hold the run had is lifted."""
    now = times.now()
    found = [
        exceeded
        for budget in ctl.cache.budgets_in(run.namespace)
        for exceeded in windows.exceeded(_name(budget), budget.spec, budget.status, now)
    ]
    held = run.condition(HELD)
    if not found and held is not None and held.status == "True":
        run.set_condition(HELD, "False", "WithinBudget", "the namespace's Budgets allow the run")
    return found


def refusal(found: list[windows.Exceeded]) -> str | None:
    """The message that fails a new run, when a used-up Budget's policy is Refuse."""
    refusing = [e for e in found if e.policy is budget_api.Policy.REFUSE]
    if not refusing:
        return None
    return "; ".join(e.message() for e in refusing) + " (policy Refuse)"


async def hold(
    ctl: context.Controller, run: runstate.RunContext, found: list[windows.Exceeded]
) -> float:
    """Keep the run Pending, saying why; the seconds until the first window rolls over."""
    message = (
        "; ".join(e.message() for e in found)
        + ". The run starts then, or once the Budget is raised"
    )
    held = run.condition(HELD)
    if held is None or held.status != "True":
        run.event(events.WARNING, RunReason.BUDGET_EXCEEDED, message)
    run.set_phase(RunPhase.PENDING, RunReason.BUDGET_EXCEEDED, message)
    run.set_condition(HELD, "True", RunReason.BUDGET_EXCEEDED, message)
    await run.save(ctl)
    ctl.metrics.held_on_purpose(run.namespace, run.name)
    until = min(e.until for e in found)
    return max((until - times.now()).total_seconds(), 0.0) + 1.0


def run_cap(ctl: context.Controller, run: runstate.RunContext) -> budget_api.RunBudget | None:
    """What the run may use in total under the namespace's Budgets (None: no Budget)."""
    budgets = ctl.cache.budgets_in(run.namespace)
    if not budgets:
        return None
    now = times.now()
    allowance = budget_api.RunBudget()
    for budget in budgets:
        allowance = windows.tighter(
            allowance, windows.left(_name(budget), budget.spec, budget.status, now)
        )
    if allowance.max_tokens is None and allowance.max_cost_usd is None:
        return None
    return windows.for_run(allowance, run.status.budget_charged or common.Usage())


async def charge(ctl: context.Controller, run: runstate.RunContext) -> None:
    """Charge what the run used since it was last charged to every Budget of its namespace."""
    total = run.stored.usage
    if total is None:
        return
    charged = run.status.budget_charged or common.Usage()
    extra = windows.delta(total, charged)
    if not (extra.prompt_tokens or extra.completion_tokens or extra.cost_usd):
        return
    for budget in ctl.cache.budgets_in(run.namespace):
        await _charge_one(ctl, run.namespace, _name(budget), extra)
    run.status.budget_charged = windows.charged_after(charged, total)


def _path(namespace: str, name: str) -> str:
    return kube.path_of("budgets", namespace, name) + "/status"


async def _charge_one(
    ctl: context.Controller, namespace: str, name: str, extra: common.Usage
) -> None:
    """Add ``extra`` to one Budget's windows, written against the version it was computed from."""
    tries = _CONFLICT_BACKOFF.tries()
    while True:
        budget = ctl.cache.budget(namespace, name)
        if budget is None:
            return
        status = windows.status_at(
            budget.spec, budget.status, times.now(), extra, budget.metadata.generation
        )
        try:
            await _write(ctl, budget, status)
            return
        except kube.ApiError as exc:
            if exc.not_found:
                return
            if not exc.conflict:
                raise
        ctl.cache.stored(await ctl.api.get(kube.path_of("budgets", namespace, name)))
        if tries.failed() is None:
            raise kube.ApiError(409, "Conflict", f"Budget {namespace}/{name} kept changing")


async def _write(
    ctl: context.Controller, budget: budget_api.Budget, status: budget_api.BudgetStatus
) -> None:
    """Replace the Budget's status (the operator owns all of it) if its version is current."""
    namespace, name = str(budget.metadata.namespace), _name(budget)
    body = {
        "metadata": {"resourceVersion": budget.metadata.resource_version},
        "status": status.model_dump(mode="json", exclude_none=True),
    }
    stored = await ctl.api.merge_patch(_path(namespace, name), body)
    ctl.cache.stored(stored)
    ctl.metrics.observe_budget(namespace, name, budget.spec, status)


async def reconcile(ctl: context.Controller, key: workqueue.Key) -> float | None:
    """Roll the Budget's windows over, export its gauges, and look at held runs again.

    Held runs are looked at when the Budget is gone, its spec changed (a new generation) or a
    window rolled over: what can release them. A charge's own write changes none of these, so
    it costs no walk over the namespace's runs.
    """
    budget = ctl.cache.budget(key.namespace, key.name)
    if budget is None:
        ctl.metrics.forget_budget(key.namespace, key.name)
        _wake_new_runs(ctl, key.namespace)
        return None
    now = times.now()
    status = windows.status_at(budget.spec, budget.status, now, None, budget.metadata.generation)
    if status != budget.status:
        _wake_new_runs(ctl, key.namespace)
        try:
            await _write(ctl, budget, status)
        except kube.ApiError as exc:
            if not exc.conflict:
                raise
            return 0.5  # a charge wrote first: compute again from its answer
    else:
        ctl.metrics.observe_budget(key.namespace, key.name, budget.spec, status)
    midnight = windows.next_start(budget_api.Window.DAY, now)
    return (midnight - now).total_seconds() + 1.0


def _wake_new_runs(ctl: context.Controller, namespace: str) -> None:
    """Enqueue the namespace's runs that have not started (a held one may start now)."""
    for flow in ctl.cache.names(workqueue.FLOW, namespace):
        for run in ctl.cache.runs_of(namespace, flow):
            phase = run.status.phase
            if not run.status.attempt and not (phase is not None and phase.terminal):
                ctl.enqueue(workqueue.FLOWRUN, namespace, run.obj["metadata"]["name"])

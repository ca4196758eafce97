"""Per-namespace Budgets: windows, charging, what is exceeded and left, and the runner's cap.

The window logic is pure (``controller/budgetwindows.py``) and takes the time as an argument, so
these tests walk a Budget through midnights and month ends with fixed instants. The runner's cap
is ``$AGENTFLOWS_BUDGET`` as the operator writes it, enforced by the real engine.
"""

from __future__ import annotations

import datetime as dt

import prometheus_client
import pytest

from agentflows.api import budget as budget_api
from agentflows.api import common
from agentflows.controller import budgetwindows as windows
from agentflows.controller import metrics as metrics_mod
from agentflows.engine import graph, store
from agentflows.engine import run as run_mod
from agentflows.runner import main as runner

from .engine.helpers import CountingHost, agents, flow_spec

DAY = budget_api.Window.DAY
MONTH = budget_api.Window.MONTH


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


def spec(**fields: object) -> budget_api.BudgetSpec:
    return budget_api.BudgetSpec.model_validate(fields)


def usage(tokens: int, cost: float = 0.0) -> common.Usage:
    return common.Usage(prompt_tokens=tokens, completion_tokens=0, cost_usd=cost)


def test_a_day_window_restarts_from_zero_after_utc_midnight_and_the_month_keeps_counting() -> None:
    team = spec(day={"tokens": 1000}, month={"tokens": 5000})
    status = windows.status_at(team, None, at("2026-12-01T10:00:00"), usage(300, 0.25))
    status = windows.status_at(team, status, at("2026-12-01T23:59:59"), usage(200))
    assert status.day is not None and status.month is not None
    assert (status.day.start, status.day.tokens) == ("2026-12-01T00:00:00Z", 500)
    assert status.day.used == "500/1000 tokens, $0.2500"

    next_day = windows.status_at(team, status, at("2026-12-02T00:00:01"), usage(50))
    assert next_day.day is not None and next_day.month is not None
    assert (next_day.day.start, next_day.day.tokens) == ("2026-12-02T00:00:00Z", 50)
    assert (next_day.month.start, next_day.month.tokens) == ("2026-12-01T00:00:00Z", 550)
    assert next_day.month.used == "550/5000 tokens, $0.2500"


def test_a_month_window_rolls_over_on_the_first_even_across_a_year_end() -> None:
    assert windows.next_start(MONTH, at("2026-12-31T23:00:00")) == at("2027-01-01T00:00:00")
    assert windows.next_start(MONTH, at("2027-01-31T12:00:00")) == at("2027-02-01T00:00:00")
    assert windows.next_start(DAY, at("2027-02-28T12:00:00")) == at("2027-03-01T00:00:00")
    team = spec(month={"costUSD": 10})
    december = windows.status_at(team, None, at("2026-12-31T23:00:00"), usage(10, 9.5))
    assert windows.current(december, MONTH, at("2027-01-01T00:00:00")).cost_usd == 0.0
    assert windows.current(december, MONTH, at("2026-12-31T23:59:59")).cost_usd == 9.5


def test_a_window_is_exceeded_once_usage_reaches_a_limit_and_says_budget_window_and_figures() -> (
    None
):
    team = spec(day={"tokens": 500, "costUSD": 1}, policy="Refuse")
    now = at("2026-12-01T10:00:00")
    below = windows.status_at(team, None, now, usage(499, 0.5))
    assert windows.exceeded("team", team, below, now) == []
    assert below.exceeded is None

    reached = windows.status_at(team, below, now, usage(1))
    assert reached.exceeded == "day"
    (found,) = windows.exceeded("team", team, reached, now)
    assert (found.window, found.policy, found.until) == (
        DAY,
        budget_api.Policy.REFUSE,
        at("2026-12-02T00:00:00"),
    )
    assert found.message() == (
        "Budget team is used up for the day starting 2026-12-01T00:00:00Z: "
        "500/500 tokens, $0.5000/$1; the window rolls over at 2026-12-02T00:00:00Z"
    )
    assert windows.exceeded("team", team, reached, at("2026-12-02T00:00:00")) == []


def test_the_run_cap_is_the_tightest_window_of_every_budget_plus_what_the_run_was_charged() -> None:
    now = at("2026-12-10T08:00:00")
    daily = spec(day={"tokens": 1000, "costUSD": 5})
    monthly = spec(month={"tokens": 20000, "costUSD": 2})
    daily_status = windows.status_at(daily, None, now, usage(700, 0.1))
    monthly_status = windows.status_at(monthly, None, now, usage(700, 0.1))
    allowance = windows.tighter(
        windows.left("daily", daily, daily_status, now),
        windows.left("monthly", monthly, monthly_status, now),
    )
    assert (allowance.max_tokens, allowance.tokens_by) == (300, "daily/day")
    assert (allowance.max_cost_usd, allowance.cost_by) == (1.9, "monthly/month")

    cap = windows.for_run(allowance, usage(120, 0.05))
    assert (cap.max_tokens, cap.max_cost_usd) == (420, 1.95)


def test_a_run_is_charged_only_what_it_used_since_it_was_last_charged() -> None:
    charged = common.Usage(prompt_tokens=100, completion_tokens=20, cost_usd=0.01)
    total = common.Usage(prompt_tokens=130, completion_tokens=25, cost_usd=0.015)
    extra = windows.delta(total, charged)
    assert (extra.prompt_tokens, extra.completion_tokens, extra.cost_usd) == (30, 5, 0.005)
    assert windows.delta(charged, charged) == common.Usage()


def test_a_lowered_usage_charges_nothing_and_never_lowers_what_the_run_was_charged() -> None:
    charged = common.Usage(prompt_tokens=1000, completion_tokens=200, cost_usd=0.5)
    lowered = common.Usage(prompt_tokens=0, completion_tokens=300, cost_usd=0.0)
    after = windows.charged_after(charged, lowered)
    assert after == common.Usage(prompt_tokens=1000, completion_tokens=300, cost_usd=0.5)
    assert windows.delta(lowered, charged) == common.Usage(completion_tokens=100)


async def test_the_operators_budget_cap_stops_a_run_as_max_tokens_would_with_its_own_reason() -> (
    None
):
    told = budget_api.RunBudget(max_tokens=15, tokens_by="team/day")
    ceilings = runner.told_budget({budget_api.RUN_BUDGET_ENV: told.model_dump_json()})
    flow = flow_spec("""
nodes:
  - {id: a, llm: {model: {name: m}, prompt: p}}
  - {id: b, llm: {model: {name: m}, prompt: p}}
  - {id: c, llm: {model: {name: m}, prompt: p}}
""")
    resolver = graph.StaticResolver(agents("a"))
    outcome = await run_mod.run_flow(
        graph.compile_flow(flow, resolver),
        run_name="r",
        input_value=None,
        store_=store.MemoryStore(),
        caps=CountingHost(),
        resolver=resolver,
        ceilings=ceilings,
    )
    assert outcome.reason == "BudgetExceeded"
    assert outcome.message == (
        "run used 30 tokens, over Budget team/day (15 tokens left for this run)"
    )
    assert outcome.usage.prompt_tokens + outcome.usage.completion_tokens == 30


def test_a_malformed_budget_variable_is_refused_in_one_line_naming_the_field() -> None:
    with pytest.raises(ValueError) as refused:
        runner.told_budget({budget_api.RUN_BUDGET_ENV: '{"maxTokens": -1}'})
    message = str(refused.value)
    assert message.startswith("AGENTFLOWS_BUDGET: maxTokens: ")
    assert "greater than or equal to 0" in message and "\n" not in message
    assert runner.told_budget({}) == ()


def test_budget_gauges_show_used_and_limit_per_window_and_drop_a_removed_limit() -> None:
    metrics = metrics_mod.Metrics(prometheus_client.CollectorRegistry())
    now = at("2026-12-01T10:00:00")
    team = spec(day={"tokens": 1000, "costUSD": 2})
    metrics.observe_budget("ns", "team", team, windows.status_at(team, None, now, usage(40, 0.5)))

    def sample(name: str, window: str) -> float | None:
        labels = {"namespace": "ns", "budget": "team", "window": window}
        return metrics.registry.get_sample_value(name, labels)

    assert sample("agentflows_budget_used_usd", "day") == 0.5
    assert sample("agentflows_budget_used_tokens", "day") == 40
    assert sample("agentflows_budget_limit_usd", "day") == 2
    assert sample("agentflows_budget_limit_tokens", "day") == 1000
    assert sample("agentflows_budget_used_usd", "month") == 0.5
    assert sample("agentflows_budget_limit_usd", "month") is None

    tokens_only = spec(day={"tokens": 1000})
    metrics.observe_budget("ns", "team", tokens_only, windows.status_at(tokens_only, None, now))
    assert sample("agentflows_budget_limit_usd", "day") is None
    metrics.forget_budget("ns", "team")
    assert sample("agentflows_budget_used_tokens", "day") is None

"""A namespace goes over its Budget on the real control plane, and the operator holds it there.

A Budget of 1,000 tokens a day; runs of a Flow whose llm node the scripted model server answers use 400
tokens each. Two runs fit; the third starts with 200 tokens left and stops at that cap with
reason BudgetExceeded (as ``limits.maxTokens`` stops a run); the fourth is held Pending with the
condition BudgetExceeded naming the Budget, the window and the figures, and starts when the
Budget is raised; with policy Refuse the next run fails. ``kubectl get budgets`` and the
operator's ``/metrics`` show used against limit. Namespace users (the built-in ``view`` and
``edit`` roles) may read Budgets and not write them.

The time from the Budget being exceeded (its status says so) to the next run being held is
printed (``budget exceeded -> next run held``), not asserted.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from tests.cluster.harness import REPO, Cluster, wait_for
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import FlowRuns, Operator
from tests.support.fixtures import *  # noqa: F403
from tests.support.model_server import API_KEY, Reply, ScriptedModelServer

pytestmark = pytest.mark.cluster

#: Tokens one scripted answer reports (prompt + completion).
RUN_TOKENS = 400


def answer() -> Reply:
    return Reply.text("Hello.", prompt_tokens=300, completion_tokens=100)


def budget(tokens: int, policy: str = "Hold") -> dict[str, Any]:
    return {
        "kind": "Budget",
        "metadata": {"name": "team"},
        "spec": {"day": {"tokens": tokens}, "month": {"tokens": 100_000}, "policy": policy},
    }


def flowrun(name: str) -> dict[str, Any]:
    return {"kind": "FlowRun", "metadata": {"name": name}, "spec": {"flow": "spend"}}


def set_up(cluster: Cluster, runs: FlowRuns, server: ScriptedModelServer) -> None:
    secret = {"metadata": {"name": "scripted-model"}, "stringData": {"api-key": API_KEY}}
    cluster.core().create_namespaced_secret(runs.namespace, secret)
    model = {
        "name": "openai/gpt-4o-mini",
        "apiBase": server.url,
        "apiKey": {"secretKeyRef": {"name": "scripted-model", "key": "api-key"}},
        "retries": 0,
    }
    runs.apply(
        {
            "kind": "Flow",
            "metadata": {"name": "spend"},
            "spec": {"nodes": [{"id": "talk", "llm": {"model": model, "prompt": "Say hello"}}]},
        },
        budget(1000),
    )


def day_usage(runs: FlowRuns) -> dict[str, Any]:
    status = (runs.get("budgets", "team") or {}).get("status") or {}
    return dict(status.get("day") or {})


def run_to_end(runs: FlowRuns, server: ScriptedModelServer, name: str) -> dict[str, Any]:
    server.script(answer())
    runs.apply(flowrun(name))
    return runs.wait_phase(name, "Succeeded", "Failed")


def test_a_namespace_over_its_budget_holds_new_runs_until_it_is_raised_or_refuses_them(
    control_plane: Cluster,
    runs: FlowRuns,
    operator: Operator,
    pod_model_server: ScriptedModelServer,
) -> None:
    set_up(control_plane, runs, pod_model_server)
    for n in (1, 2):
        status = run_to_end(runs, pod_model_server, f"spend-{n}")
        assert status["phase"] == "Succeeded", status.get("message")
        wait_for(lambda n=n: day_usage(runs).get("tokens") == n * RUN_TOKENS, 30, "charged")
    assert day_usage(runs)["used"].startswith("800/1000 tokens, $0.000")

    # 200 tokens left: the runner's cap stops the third run as limits.maxTokens would
    stopped = run_to_end(runs, pod_model_server, "spend-3")
    assert (stopped["phase"], stopped["reason"]) == ("Failed", "BudgetExceeded")
    assert stopped["message"].endswith(
        "run used 400 tokens, over Budget team/day (200 tokens left for this run)"
    )

    exceeded = wait_for(
        lambda: (runs.get("budgets", "team") or {}).get("status", {}).get("exceeded") == "day",
        30,
        "Budget team exceeded",
        interval=0.05,
    )
    since = time.monotonic()
    assert exceeded
    runs.apply(flowrun("spend-4"))
    held = wait_for(
        lambda: runs.condition("flowruns", "spend-4", "BudgetExceeded"), 60, "held", 0.05
    )
    print(f"\nbudget exceeded -> next run held: {time.monotonic() - since:.3f}s")
    assert (held["status"], held["reason"]) == ("True", "BudgetExceeded")
    assert (
        held["message"].startswith("Budget team is used up for the day starting ")
        and "1200/1000 tokens" in held["message"]
    )
    assert held["message"].endswith(". The run starts then, or once the Budget is raised")
    status = runs.status("spend-4")
    assert (status["phase"], status["reason"], status["message"]) == (
        "Pending",
        "BudgetExceeded",
        held["message"],
    )
    assert runs.pods("spend-4") == []
    # the Event is posted after the status write that holds the run
    warnings = wait_for(
        lambda: [e for e in runs.events("spend-4") if e.reason == "BudgetExceeded"],
        30,
        "the BudgetExceeded Event",
    )
    assert [e.type for e in warnings] == ["Warning"]
    # held on purpose: not a run whose pod cannot be created (AgentflowsRunsStuckPending)
    oldest = f'agentflows_oldest_pending_run_timestamp_seconds{{flow="spend",namespace="{runs.namespace}"}}'
    assert oldest not in operator.metrics()

    listed = control_plane.kubectl("get", "budgets", "-n", runs.namespace).stdout
    print(listed)
    header, row = listed.splitlines()
    assert header.split() == ["NAME", "POLICY", "DAY", "MONTH", "EXCEEDED", "AGE"]
    assert row.split()[:4] == ["team", "Hold", "1200/1000", "tokens,"]
    assert "1200/100000 tokens" in row and " day " in row

    pod_model_server.script(answer())
    runs.apply(budget(5000))
    status = runs.wait_phase("spend-4", "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", status.get("message")
    lifted = runs.condition("flowruns", "spend-4", "BudgetExceeded")
    assert lifted is not None and (lifted["status"], lifted["reason"]) == ("False", "WithinBudget")
    wait_for(lambda: day_usage(runs).get("tokens") == 4 * RUN_TOKENS, 30, "spend-4 charged")

    runs.apply(budget(1000, policy="Refuse"))
    wait_for(lambda: str(day_usage(runs).get("used")).startswith("1600/1000 tokens"), 30, "lowered")
    runs.apply(flowrun("spend-5"))
    refused = runs.wait_phase("spend-5", "Failed", "Succeeded", timeout=60)
    assert refused["reason"] == "BudgetExceeded"
    assert refused["message"].startswith("Budget team is used up for the day starting ")
    assert refused["message"].endswith("(policy Refuse)")
    assert runs.pods("spend-5") == []

    metrics = operator.metrics()
    labels = f'budget="team",namespace="{runs.namespace}",window="day"'
    assert re.search(rf"agentflows_budget_used_tokens\{{{labels}\}} 1600\.0", metrics), metrics
    assert re.search(rf"agentflows_budget_limit_tokens\{{{labels}\}} 1000\.0", metrics)
    assert re.search(rf"agentflows_budget_used_usd\{{{labels}\}} 0\.000\d+", metrics)


def test_namespace_users_read_budgets_and_only_admins_write_them(
    control_plane: Cluster, runs: FlowRuns
) -> None:
    control_plane.kubectl("apply", "-k", str(REPO / "config/rbac/users"))
    for user, role in (("vera", "view"), ("eddie", "edit")):
        control_plane.kubectl(
            "create", "rolebinding", f"{user}-{role}", f"--clusterrole={role}",
            f"--user={user}", "-n", runs.namespace,
        )  # fmt: skip

    def can(user: str, verb: str) -> bool:
        answer = control_plane.kubectl(
            "auth", "can-i", verb, "budgets.agentflows.io", "-n", runs.namespace,
            f"--as={user}", check=False,
        )  # fmt: skip
        return answer.stdout.strip() == "yes"

    wait_for(lambda: can("vera", "list"), 30, "view aggregated")
    assert [can(u, v) for u in ("vera", "eddie") for v in ("get", "list", "watch")] == [True] * 6
    assert [can(u, v) for u in ("vera", "eddie") for v in ("create", "patch", "delete")] == [
        False
    ] * 6

"""A run writes only the AgentSessions of the memories its Agents name.

RBAC cannot name those memories (a session is named at run time, and every run shares one
ServiceAccount), so the operator gives each run that writes a memory a Role granting the verb
``write`` on ``<run>/<memory>`` (:func:`agentflows.controller.pods.sessions_grant`), and the
runner policy asks the authorizer for it before a runner's write
(``config/policies/runner_own_run.yaml``). On the API server with a pod's token:
``tests/cluster/test_attack_runner_identity.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from agentflows.agents import sessions
from agentflows.api import agent as agent_api
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.controller import flowruns, pods, settings
from agentflows.controller.runtime import workqueue
from agentflows.kube import client as kube_client
from agentflows.kube import objects, session_store
from tests.support.fake_flowrun_api import FakeFlowRunApi, controller_on

REPO = Path(__file__).resolve().parents[2]


def _run(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "agentflows.io/v1alpha1",
        "kind": "FlowRun",
        "metadata": {"name": name, "namespace": "team", "uid": "uid-1"},
        "status": {},
    }


def _grant(run_name: str, memories: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    flow = flow_api.FlowSpec.model_validate(
        {"nodes": [{"id": "a", "agent": {"name": "support", "prompt": "hi"}}]}
    )
    agent = agent_api.AgentSpec.model_validate({"model": {"name": "openai/m"}, "session": "s"})
    run = _run(run_name)
    pod = pods.runner_pod(
        run,
        3,
        "answer",
        {"answer": flow},
        {"support": agent},
        settings.OperatorConfig(),
        status=flowrun_api.status_of(run),
    )
    return pod, pods.sessions_grant(pod, run, memories)


def test_a_run_writing_a_memory_gets_a_role_on_run_slash_memory_bound_to_its_account() -> None:
    pod, (role, binding) = _grant("answer-1", ["support", "team"])
    [rule] = role["rules"]
    assert rule == {
        "apiGroups": ["agentflows.io"],
        "resources": ["agentsessions"],
        "verbs": ["write"],
        "resourceNames": ["answer-1/support", "answer-1/team"],
    }
    assert binding["roleRef"]["name"] == role["metadata"]["name"] == "answer-1-agentflows-sessions"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": pod["spec"]["serviceAccountName"], "namespace": "team"}
    ]
    [owner] = role["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner.get("blockOwnerDeletion")) == (
        "FlowRun",
        "answer-1",
        None,
    )


def test_the_grant_names_the_run_as_the_policy_reads_it_from_a_long_pod_name() -> None:
    long_name = "r" * 253
    pod, (role, _) = _grant(long_name, ["support"])
    run_in_policy = pod["metadata"]["name"].rsplit("-", 1)[0]
    assert run_in_policy != long_name  # the pod name shortened it
    assert role["rules"][0]["resourceNames"] == [f"{run_in_policy}/support"]
    assert len(role["metadata"]["name"]) <= objects.NAME_MAX


def test_a_run_writing_no_memory_gets_no_grant() -> None:
    _, grant = _grant("answer-1", [])
    assert grant == []


def test_the_operator_may_grant_write_and_the_runner_may_not_get_list_or_delete() -> None:
    operator = yaml.safe_load((REPO / "config/rbac/role.yaml").read_text())
    [own] = [r for r in operator["rules"] if "agentsessions" in r["resources"]]
    assert {"write", "list", "delete"} <= set(own["verbs"])
    runner = yaml.safe_load((REPO / "config/rbac/runner/role.yaml").read_text())
    [rule] = [r for r in runner["rules"] if "agentsessions" in r["resources"]]
    assert sorted(rule["verbs"]) == ["create", "patch", "update"]


class _Planted:
    """An API client whose every GET answers one AgentSession (planted by another memory)."""

    async def get(self, path: str) -> dict[str, Any]:
        return {
            "metadata": {"name": path.rsplit("/", 1)[-1], "resourceVersion": "1"},
            "spec": {"memory": "payroll", "session": "T-1", "agent": "payroll"},
        }


def test_a_session_planted_under_another_memorys_name_is_refused_not_loaded() -> None:
    store = session_store.SessionStore(cast(kube_client.Client, _Planted()), "team")
    with pytest.raises(sessions.StoreError) as caught:
        asyncio.run(store.read("support", "T-1"))
    name = objects.session_name("support", "T-1")
    assert str(caught.value) == (
        f"AgentSession {name} holds session 'T-1' of memory 'payroll', not 'T-1' of 'support': "
        f"this memory's Agents did not write it; delete it (kubectl delete agentsession {name})"
    )


async def test_a_runs_memories_are_found_once_for_its_attempts_grants_and_its_retention(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found = sessions.memories
    walks: list[str] = []

    def counted(
        flows: dict[str, flow_api.FlowSpec], agents: dict[str, agent_api.AgentSpec]
    ) -> dict[str, agent_api.AgentMemory]:
        walks.append(",".join(agents))
        return found(flows, agents)

    monkeypatch.setattr(sessions, "memories", counted)
    # attempt 1 paused for a human, who decided: attempt 2 is reserved, its pod not created yet
    status = {
        "phase": "Running",
        "attempt": 2,
        "pod": "answer-1-2",
        "podCreated": 1,
        "startTime": "2026-12-02T13:00:00Z",
        "result": {"attempt": 1, "phase": "Waiting", "message": "waiting"},
    }
    fake = FakeFlowRunApi("team", "answer-1", spec={"flow": "f"}, status=status)
    fake.snapshot(
        {"nodes": [{"id": "a", "agent": {"name": "support", "prompt": "hi"}}]},
        {"support": {"model": {"name": "openai/m"}, "session": "s"}},
    )
    key = workqueue.Key(workqueue.FLOWRUN, "team", "answer-1")
    async with controller_on(fake) as ctl:
        await flowruns.reconcile(ctl, key)
        assert list(fake.pods) == ["answer-1-2"]
        [role] = fake.roles.values()
        assert role["rules"][0]["resourceNames"] == ["answer-1/support"]
        # attempt 2 succeeds: the run finishes and its memory is noted for retention
        fake.flowrun["status"]["result"] = {"attempt": 2, "phase": "Succeeded", "message": ""}
        ctl.cache.stored(fake.flowrun)
        await flowruns.reconcile(ctl, key)
        assert fake.status["phase"] == "Succeeded"
        assert list(ctl.retention) == [("team", "support")]
    assert walks == ["support"]

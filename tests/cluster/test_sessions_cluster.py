"""A conversation that persists across FlowRuns on a real control plane, as an AgentSession.

The operator runs as in ``test_operator.py`` (its ServiceAccount's token, config/rbac and
config/policies as shipped); runner pods run with the runner Role of config/rbac/runner, so the
verbs it grants on agentsessions are tested for real. The agent's model is the scripted server
on loopback, which runner pods (local processes) reach directly.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from typing import Any

import pytest

from tests.cluster.harness import Cluster, wait_for
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import FlowRuns, Operator
from tests.support.fixtures import *  # noqa: F403
from tests.support.model_server import Reply, ScriptedModelServer

pytestmark = pytest.mark.cluster


def _documents(server: ScriptedModelServer) -> list[dict[str, Any]]:
    return [
        {
            "kind": "Agent",
            "metadata": {"name": "support"},
            "spec": {
                "model": {"name": "openai/scripted-model", "apiBase": server.url, "retries": 0},
                "systemPrompt": "You answer tickets.",
                "session": "={{ .run.input.ticket }}",
            },
        },
        {
            "kind": "Flow",
            "metadata": {"name": "answer"},
            "spec": {
                "nodes": [
                    {"id": "reply", "agent": {"name": "support", "prompt": "{{ .run.input.text }}"}}
                ],
                "output": "=.nodes.reply.text",
            },
        },
    ]


def _start(runs: FlowRuns, name: str, text: str, ticket: str = "T-42") -> None:
    runs.apply(
        {
            "kind": "FlowRun",
            "metadata": {"name": name},
            "spec": {"flow": "answer", "input": {"ticket": ticket, "text": text}},
        }
    )


def _session(runs: FlowRuns) -> dict[str, Any]:
    found = runs.custom.list_namespaced_custom_object(
        "agentflows.io", "v1alpha1", runs.namespace, "agentsessions"
    )["items"]
    assert len(found) == 1, found
    session: dict[str, Any] = found[0]
    return session


def test_a_session_continues_over_three_flowruns_one_after_its_runner_pod_was_killed(
    control_plane: Cluster, runs: FlowRuns, pod_model_server: ScriptedModelServer
) -> None:
    runs.apply(*_documents(pod_model_server))
    pod_model_server.script(Reply.text("Restart the app."))
    _start(runs, "ticket-1", "The app crashes.")
    assert runs.wait_phase("ticket-1", "Succeeded", "Failed")["phase"] == "Succeeded"

    # the second run's first pod dies while the model is answering; its next attempt
    # continues the same conversation, which the killed turn never wrote. The answer to the
    # killed pod is held until the run is over (an event, not a delay the kubelet's kill had to
    # beat: with 30 s, CI once saw the first pod live to read it)
    held = threading.Event()
    pod_model_server.script(Reply.text("never seen", hold=held), Reply.text("Reinstall it."))
    _start(runs, "ticket-2", "It still crashes.")
    wait_for(lambda: len(pod_model_server.requests) == 2, 120, "the second run's model call")
    killed = runs.status("ticket-2")["pod"]
    control_plane.core().delete_namespaced_pod(killed, runs.namespace, grace_period_seconds=0)
    status = runs.wait_phase("ticket-2", "Succeeded", "Failed", timeout=240)
    held.set()
    assert status["phase"] == "Succeeded" and status["attempt"] >= 2, status

    pod_model_server.script(Reply.text("Glad it works."))
    _start(runs, "ticket-3", "That fixed it.")
    assert runs.wait_phase("ticket-3", "Succeeded", "Failed")["phase"] == "Succeeded"

    sent = [(m["role"], m["content"]) for m in pod_model_server.requests[-1].messages]
    assert sent == [
        ("system", "You answer tickets."),
        ("user", "The app crashes."),
        ("assistant", "Restart the app."),
        ("user", "It still crashes."),
        ("assistant", "Reinstall it."),
        ("user", "That fixed it."),
    ]
    session = _session(runs)
    assert session["spec"]["session"] == "T-42" and session["spec"]["turns"] == 3
    [owner] = session["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("Agent", "support")
    shown = control_plane.kubectl("get", "agentsessions", "-n", runs.namespace).stdout
    print(shown)
    header, row = shown.splitlines()
    assert header.split()[:4] == ["NAME", "MEMORY", "SESSION", "TURNS"]
    assert row.split()[1:4] == ["support", "T-42", "3"]
    size = len(json.dumps(session["spec"]).encode())
    print(f"stored session after 3 turns: {size} bytes")
    cli = [sys.executable, "-m", "agentflows.cli.main", "sessions"]
    where = ["-n", runs.namespace, "--kubeconfig", str(control_plane.kubeconfig())]
    listed = subprocess.run([*cli, "list", *where], capture_output=True, text=True, check=True)
    print(listed.stdout)
    assert listed.stdout.splitlines()[1].split()[:4] == ["support", "T-42", "3", str(size)]
    deleted = subprocess.run(
        [*cli, "delete", "support", "T-42", *where], capture_output=True, text=True, check=True
    )
    assert deleted.stdout == "deleted session 'T-42' of memory 'support'\n"
    assert (
        runs.custom.list_namespaced_custom_object(
            "agentflows.io", "v1alpha1", runs.namespace, "agentsessions"
        )["items"]
        == []
    )


def test_fifty_parallel_map_items_write_one_agentsession_without_losing_a_turn(
    control_plane: Cluster, runs: FlowRuns, pod_model_server: ScriptedModelServer
) -> None:
    agent, _ = _documents(pod_model_server)
    mapped = {
        "kind": "Flow",
        "metadata": {"name": "batch"},
        "spec": {
            "nodes": [
                {
                    "id": "each",
                    "map": {
                        "items": "=.run.input.items",
                        "concurrency": 50,
                        "agent": {
                            "name": "support",
                            "prompt": "item {{ .item }}",
                            "session": "batch-1",
                            "request": "={{ .item }}",
                        },
                    },
                }
            ]
        },
    }
    runs.apply(agent, mapped)
    pod_model_server.script(*(Reply.text("noted") for _ in range(50)))
    runs.apply(
        {
            "kind": "FlowRun",
            "metadata": {"name": "batch-run"},
            "spec": {"flow": "batch", "input": {"items": list(range(50))}},
        }
    )
    status = runs.wait_phase("batch-run", "Succeeded", "Failed", timeout=240)
    assert status["phase"] == "Succeeded", status.get("message")
    spec = _session(runs)["spec"]
    assert spec["turns"] == 50
    assert sorted(c["request"] for c in spec["conversations"]) == sorted(str(i) for i in range(50))
    assert all(c["turns"] == 1 and len(c["messages"]) == 2 for c in spec["conversations"])


def test_the_operator_retires_sessions_beyond_max_sessions_when_a_run_of_the_memory_ends(
    control_plane: Cluster,
    runs: FlowRuns,
    pod_model_server: ScriptedModelServer,
    operator: Operator,
) -> None:
    # the runner may not list or delete AgentSessions; the operator applies the Agent's bounds
    agent, flow = _documents(pod_model_server)
    agent["spec"]["memory"] = {"maxSessions": 2}
    runs.apply(agent, flow)
    for ticket in ("T-1", "T-2", "T-3"):
        pod_model_server.script(Reply.text("noted"))
        _start(runs, f"run-{ticket.lower()}", "hello", ticket=ticket)
        assert runs.wait_phase(f"run-{ticket.lower()}", "Succeeded", "Failed")["phase"] == (
            "Succeeded"
        )

    def kept() -> list[str] | None:
        items = runs.custom.list_namespaced_custom_object(
            "agentflows.io", "v1alpha1", runs.namespace, "agentsessions"
        )["items"]
        found = sorted(item["spec"]["session"] for item in items)
        return found if found == ["T-2", "T-3"] else None

    assert wait_for(kept, 60, "the operator retires T-1") == ["T-2", "T-3"]
    retired = f'agentflows_sessions_retired_total{{namespace="{runs.namespace}"}} 1.0'
    assert retired in operator.metrics()
    assert f"memory {runs.namespace}/support: 1 session(s) retired" in operator.log_tail(200)

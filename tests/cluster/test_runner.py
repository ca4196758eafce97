"""``agentflows runner`` as a process against a real API server, fed as the operator feeds it.

Each test creates a FlowRun (no Flow object: the runner reads only the snapshot), the snapshot
ConfigMap, its digest and ``status.attempt`` by hand, runs ``agentflows runner`` with the admin
kubeconfig and its ConfigMaps volume filled as a kubelet would (tests/cluster/runner_process.py),
and looks at the exit status, the FlowRun's status and what the python tools wrote to a file.
"""

from __future__ import annotations

import asyncio
import signal
import textwrap
from pathlib import Path
from typing import Any

import pytest

from agentflows.api import agent as agent_api
from agentflows.api import flow as flow_api
from agentflows.api import snapshot as snapshot_api
from agentflows.engine import graph
from agentflows.kube import client as kube_client
from agentflows.kube import snapshot as snapshot_mod
from tests.cluster import runner_process
from tests.cluster.harness import Cluster, wait_for
from tests.cluster.kube_fixtures import (  # noqa: F401  (fixtures)
    crds,
    create_flowrun,
    get_flowrun,
    grant_deciders,
    kube,
    kube_namespace,
    patch_status,
    unique,
)

pytestmark = pytest.mark.cluster


#: A python tool that appends its "mark" to the file "log", optionally blocks while the file
#: "block" exists, and answers {"n": 2 * n}. (Contained tools of a root runner run each as a uid
#: of their own: the log they all append to is made writable for every one.)
TOOL_SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    args = json.load(sys.stdin)
    os.umask(0)
    with open(args["log"], "a") as handle:
        handle.write(args["mark"] + "\\n")
    while args.get("block") and os.path.exists(args["block"]):
        time.sleep(0.2)
    print(json.dumps({"n": 2 * (args.get("n") or 0)}))
""")


def _tool(node_id: str, log: Path, **args: Any) -> dict[str, Any]:
    return {
        "id": node_id,
        "tool": {
            "python": {"script": TOOL_SCRIPT, "timeoutSeconds": 300},
            "args": {"log": str(log), "mark": node_id, **args},
        },
    }


def _lookup(flows: dict[str, Any], agents: dict[str, Any]) -> graph.StaticResolver:
    """A lookup over every Flow and Agent given as wire JSON."""
    return graph.StaticResolver(
        {name: agent_api.AgentSpec.model_validate(spec) for name, spec in agents.items()},
        {name: flow_api.FlowSpec.model_validate(spec) for name, spec in flows.items()},
    )


def _marks(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


class Runs:
    """Creates FlowRuns with snapshots and runs ``agentflows runner`` on them."""

    def __init__(self, cluster: Cluster, api: kube_client.Client, namespace: str) -> None:
        self.cluster = cluster
        self.api = api
        self.namespace = namespace

    async def create(self, flow: dict[str, Any], input_value: Any = None) -> str:
        """A FlowRun of ``flow`` with a hand-written snapshot ConfigMap, at attempt 1."""
        name = unique("run")
        snapshot = {"flow": "f", "flows": {"f": flow}, "agents": {}}
        await runner_process.prepare(self.api, self.namespace, name, snapshot, None, input_value)
        return name

    async def attempt(self, name: str, attempt: int) -> None:
        """Start an attempt, as the operator does before it creates the pod."""
        await patch_status(self.api, self.namespace, name, {"attempt": attempt})

    async def start(self, name: str) -> asyncio.subprocess.Process:
        """Start the runner."""
        return await runner_process.start(self.cluster, self.api, self.namespace, name)

    async def run(self, name: str) -> runner_process.Finished:
        """Run the runner to its end."""
        return await runner_process.run(self.cluster, self.api, self.namespace, name)

    async def status(self, name: str) -> dict[str, Any]:
        status: dict[str, Any] = (await get_flowrun(self.api, self.namespace, name))["status"]
        return status


@pytest.fixture
async def runs(
    control_plane: Cluster,
    kube: kube_client.Client,  # noqa: F811
    kube_namespace: str,  # noqa: F811
) -> Runs:
    return Runs(control_plane, kube, kube_namespace)


async def test_transform_and_python_tool_flow_succeeds_with_nodes_in_status(
    runs: Runs, tool_dir: Path
) -> None:
    log = tool_dir / "calls.log"
    flow = {
        "input": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
        "nodes": [
            _tool("double", log, n="=.run.input.n"),
            {"id": "inc", "transform": "=.nodes.double.json.n + 1"},
        ],
        "output": "=.nodes.inc.json",
    }
    name = await runs.create(flow, {"n": 20})
    done = await runs.run(name)
    assert done.returncode == 0, done.stderr
    status = await runs.status(name)
    assert status["result"]["phase"] == "Succeeded"
    assert status["result"]["attempt"] == 1
    assert status["output"] == 41
    assert {k: v["phase"] for k, v in status["nodes"].items()} == {
        "double": "Succeeded",
        "inc": "Succeeded",
    }
    assert status["nodes"]["double"]["output"]["json"] == {"n": 40}
    assert "currentNode" not in status
    assert _marks(log) == ["double"]
    lines = [line for line in done.stdout.splitlines() if " node " in line]
    assert len(lines) == 2 and "double (tool) succeeded" in lines[0]


async def test_approval_waits_then_a_second_runner_finishes_without_rerunning_nodes(
    runs: Runs, tool_dir: Path
) -> None:
    log = tool_dir / "calls.log"
    flow = {
        "nodes": [
            _tool("before", log),
            {"id": "gate", "approval": {"message": "go?", "approvers": {"groups": ["editors"]}}},
            _tool("after", log),
        ]
    }
    name = await runs.create(flow)

    first = await runs.run(name)
    assert first.returncode == 3, first.stderr
    status = await runs.status(name)
    assert status["result"] == {**status["result"], "phase": "Waiting", "attempt": 1}
    request = status["requests"]["gate"]
    assert (request["kind"], request["message"], request["node"]) == ("approval", "go?", "gate")
    assert request["approvers"]["groups"] == ["editors"]
    assert "decision" not in request
    assert status["nodes"]["before"]["phase"] == "Succeeded"
    assert status["nodes"]["gate"]["phase"] == "Waiting"

    # alice (group editors) decides with her own credentials, as the decision policy requires
    grant_deciders(runs.cluster, runs.namespace)
    async with kube_client.Client.from_env(
        str(runs.cluster.kubeconfig("alice")), retry_seconds=10
    ) as alice:
        await patch_status(
            alice,
            runs.namespace,
            name,
            {"requests": {"gate": {"decision": "approve", "decidedBy": "alice"}}},
        )
    await runs.attempt(name, 2)
    second = await runs.run(name)
    assert second.returncode == 0, second.stderr
    status = await runs.status(name)
    assert status["result"]["phase"] == "Succeeded" and status["result"]["attempt"] == 2
    assert status["requests"]["gate"]["decidedBy"] == "alice"
    assert status["nodes"]["gate"]["output"]["json"]["decision"] == "approve"
    assert _marks(log) == ["before", "after"]


async def test_invalid_flow_in_the_snapshot_fails_the_run_with_reason_flow_invalid(
    runs: Runs,
) -> None:
    flow = {"nodes": [{"id": "ask", "agent": {"name": "ghost", "prompt": "hi"}}]}
    name = await runs.create(flow)
    done = await runs.run(name)
    assert done.returncode == 1, done.stderr
    result = (await runs.status(name))["result"]
    assert (result["phase"], result["reason"]) == ("Failed", "FlowInvalid")
    assert "ghost" in result["message"]


async def test_an_offloaded_output_whose_configmap_is_gone_fails_the_run_for_good(
    runs: Runs,
) -> None:
    flow = {"nodes": [{"id": "a", "transform": "=1"}, {"id": "b", "transform": "=.nodes.a.json"}]}
    name = await runs.create(flow)
    lost = {"phase": "Succeeded", "attempts": 1, "outputRef": "configmap:lost-out:1"}
    await patch_status(runs.api, runs.namespace, name, {"nodes": {"a": lost}})
    done = await runs.run(name)
    assert done.returncode == 1, done.stderr
    result = (await runs.status(name))["result"]
    assert (result["phase"], result["reason"]) == ("Failed", "StateLost")
    assert result["message"] == f"ConfigMap {runs.namespace}/lost-out-0 is gone"


async def test_sigterm_leaves_no_result_and_the_next_attempt_redoes_only_the_node_in_flight(
    runs: Runs, tool_dir: Path
) -> None:
    log, block = tool_dir / "calls.log", tool_dir / "block"
    block.touch()
    flow = {"nodes": [_tool("first", log), _tool("slow", log, block=str(block))]}
    name = await runs.create(flow)

    process = await runs.start(name)
    try:

        def started() -> bool:
            return _marks(log) == ["first", "slow"]

        await asyncio.to_thread(wait_for, started, 120, "the slow node to start")
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 60) == 143
    finally:
        if process.returncode is None:
            process.kill()
    status = await runs.status(name)
    assert "result" not in status
    assert status["nodes"]["slow"]["phase"] == "Running"
    assert status["currentNode"] == "slow"

    block.unlink()
    await runs.attempt(name, 2)
    done = await runs.run(name)
    assert done.returncode == 0, done.stderr
    status = await runs.status(name)
    assert status["nodes"]["slow"]["attempts"] == 2
    assert _marks(log) == ["first", "slow", "slow"]


async def test_snapshot_written_by_the_operator_helpers_runs_and_is_written_once(
    runs: Runs, tool_dir: Path
) -> None:
    log = tool_dir / "calls.log"
    flows = {"main": {"nodes": [{"id": "sub", "flow": {"name": "child", "input": 1}}]}}
    flows["child"] = {"nodes": [_tool("leaf", log)]}
    flows["unrelated"] = {"nodes": [{"id": "x", "transform": "=1"}]}
    snap = snapshot_mod.build_snapshot("main", _lookup(flows, {}))
    assert sorted(snap.flows) == ["child", "main"]
    name = unique("run")
    obj = await create_flowrun(runs.api, runs.namespace, name, flow="main")
    first = await snapshot_mod.write_snapshot(runs.api, obj, snap)
    # an admission retried with what it built again keeps the ConfigMap as it is
    again = await snapshot_mod.write_snapshot(runs.api, obj, snap)
    assert again["metadata"]["uid"] == first["metadata"]["uid"]
    read = await snapshot_mod.read_snapshot(runs.api, runs.namespace, name)
    assert read == snap
    # as admission does: the digest the runner checks the mounted snapshot against
    digest = snapshot_api.digest_of(first["data"][snapshot_mod.SNAPSHOT_KEY])
    await patch_status(runs.api, runs.namespace, name, {"snapshotDigest": digest})
    await runs.attempt(name, 1)
    done = await runs.run(name)
    assert done.returncode == 0, done.stderr
    status = await runs.status(name)
    assert status["nodes"]["sub/leaf"]["phase"] == "Succeeded"
    assert _marks(log) == ["leaf"]


def test_snapshot_collects_every_agent_and_flow_reachable_from_the_flow() -> None:
    flows = {
        "main": {
            "nodes": [
                {"id": "a", "agent": {"name": "writer", "prompt": "p"}},
                {"id": "t", "tool": {"agent": "tooler", "name": "search"}},
                {"id": "m", "map": {"items": "=[]", "flow": {"name": "per-item"}}},
                {"id": "s", "flow": {"name": "sub"}},
            ]
        },
        "per-item": {
            "nodes": [
                {"id": "x", "map": {"items": "=[]", "agent": {"name": "mapper", "prompt": "p"}}}
            ]
        },
        "sub": {"nodes": [{"id": "y", "transform": "=1"}]},
        "from-agent": {"nodes": [{"id": "z", "agent": {"name": "writer", "prompt": "p"}}]},
        "unreached": {"nodes": [{"id": "u", "transform": "=1"}]},
    }
    model = {"model": {"name": "openai/test"}}
    agents = {
        "writer": {**model, "subAgents": ["helper"], "subFlows": ["from-agent"]},
        "helper": model,
        "tooler": model,
        "mapper": model,
        "unused": model,
    }
    snap = snapshot_mod.build_snapshot("main", _lookup(flows, agents))
    assert snap.flow == "main"
    assert sorted(snap.flows) == ["from-agent", "main", "per-item", "sub"]
    assert sorted(snap.agents) == ["helper", "mapper", "tooler", "writer"]

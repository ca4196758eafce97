"""The FlowRun-status store on a real API server: the engine's store contract, offload, bounds."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from agentflows.api import flowrun as flowrun_api
from agentflows.engine import graph, run, store
from agentflows.kube import client as kube_client
from agentflows.kube import status_store
from agentflows.runner import main as runner_main
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
from tests.unit.engine.helpers import CountingHost, flow_spec
from tests.unit.engine.store_contract import LONG_LOOP, StoreContract

pytestmark = pytest.mark.cluster

Phase = flowrun_api.NodePhase
MAX_FLOWRUN_BYTES = 256 * 1024


class StatusBackend:
    """The contract's backend: every new store is a new runner over the same FlowRun."""

    def __init__(
        self, api: kube_client.Client, namespace: str, name: str, cluster: Cluster
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.cluster = cluster

    def new_store(self) -> status_store.StatusStore:
        return status_store.StatusStore(self.api, self.namespace, self.name, attempt=1)

    async def decide(self, st: Any, request_id: str, **fields: Any) -> None:
        """What ``kubectl patch --subresource=status --type=merge`` does for a human.

        The human is the user named in ``decided_by`` (alice and bob are real users of the
        control plane), patching with their own credentials, as the decision policy requires.
        """
        wire = {}
        for field, value in fields.items():
            alias = flowrun_api.HumanRequest.model_fields[field].alias or field
            wire[alias] = getattr(value, "value", value)
        user = str(fields.get("decided_by", "admin"))
        kubeconfig = str(self.cluster.kubeconfig(user))
        async with kube_client.Client.from_env(kubeconfig, retry_seconds=10) as as_user:
            await patch_status(as_user, self.namespace, self.name, {"requests": {request_id: wire}})


class TestStatusStore(StoreContract):
    @pytest.fixture
    async def backend(
        self,
        kube: kube_client.Client,  # noqa: F811
        kube_namespace: str,  # noqa: F811
        control_plane: Cluster,
    ) -> StatusBackend:
        grant_deciders(control_plane, kube_namespace)
        name = unique("contract")
        await create_flowrun(
            kube, kube_namespace, name, input_value={"topic": "x"}, trigger={"type": "manual"}
        )
        return StatusBackend(kube, kube_namespace, name, control_plane)


async def _new_run(
    api: kube_client.Client, namespace: str, attempt: int = 1
) -> status_store.StatusStore:
    name = unique("run")
    await create_flowrun(api, namespace, name, flow="big")
    return status_store.StatusStore(api, namespace, name, attempt=attempt)


def _mixed_text(size: int) -> str:
    """At least ``size`` bytes of UTF-8 with 1- to 4-byte characters (splits must not cut them)."""
    unit = "ascii ü € 𝄞 " * 8
    return unit * (size // len(unit.encode()) + 1)


async def test_ten_mib_output_round_trips_while_the_flowrun_stays_small(
    kube: kube_client.Client,  # noqa: F811
    kube_namespace: str,  # noqa: F811
) -> None:
    st = await _new_run(kube, kube_namespace)
    big = {"json": {"report": _mixed_text(10 * 1024 * 1024), "none": None}, "text": "t"}
    assert len(json.dumps(big, ensure_ascii=False).encode()) >= 10 * 1024 * 1024
    await st.save_node("big", flowrun_api.NodeStatus(phase=Phase.SUCCEEDED, output=big))
    await st.save_outcome(store.Outcome(flowrun_api.RunPhase.SUCCEEDED, output=big))

    loaded = await status_store.StatusStore(kube, kube_namespace, st.name, attempt=1).load()
    assert loaded.nodes["big"].output == big
    assert loaded.outcome is not None and loaded.outcome.output == big
    obj = await get_flowrun(kube, kube_namespace, st.name)
    size = len(json.dumps(obj))
    print(f"FlowRun with a 10 MiB node output and run output: {size} bytes")
    assert size < MAX_FLOWRUN_BYTES
    ref = obj["status"]["nodes"]["big"]["outputRef"]
    assert ref.startswith(f"configmap:{st.name}-out-")
    assert await status_store.read_output(kube, kube_namespace, ref) == big


async def test_a_loop_of_1000_iterations_of_8_kb_outputs_leaves_the_flowrun_small(
    kube: kube_client.Client,  # noqa: F811
    kube_namespace: str,  # noqa: F811
) -> None:
    """Each output (about 8 KB, under the offload threshold) stays inline: unfolded, 8 MB."""
    st = await _new_run(kube, kube_namespace)
    spec = flow_spec(
        LONG_LOOP.replace("{id: draft, tool: {python: {script: x}}}",
                          '{id: draft, transform: "=\\"x\\" * 4000"}')
    )  # fmt: skip
    outcome = await run.run_flow(
        graph.compile_flow(spec, graph.StaticResolver()),
        run_name=st.name, input_value=None, store_=st, caps=CountingHost(),
        resolver=graph.StaticResolver(),
    )  # fmt: skip
    assert outcome.phase == flowrun_api.RunPhase.SUCCEEDED, outcome.message
    obj = await get_flowrun(kube, kube_namespace, st.name)
    size = len(json.dumps(obj))
    records = obj["status"]["nodes"]
    print(f"FlowRun after a 1,000-iteration loop of 8 KB outputs: {size} bytes, "
          f"{len(records)} node records")  # fmt: skip
    assert size < MAX_FLOWRUN_BYTES
    assert len(records) == 3 * (1 + flowrun_api.ITERATIONS_KEPT) + 3 + 1


async def test_offloaded_configmaps_are_owned_by_the_flowrun_and_within_limits(
    kube: kube_client.Client,  # noqa: F811
    kube_namespace: str,  # noqa: F811
) -> None:
    st = await _new_run(kube, kube_namespace)
    await st.save_node(
        "n1", flowrun_api.NodeStatus(phase=Phase.SUCCEEDED, output={"json": "é" * 1_500_000})
    )
    obj = await get_flowrun(kube, kube_namespace, st.name)
    listed = await kube.get(
        kube_client.path_of("configmaps", kube_namespace),
        labelSelector=f"agentflows.io/run={st.name}",
    )
    items = listed["items"]
    assert len(items) >= 6  # 3 MB of two-byte characters in parts of at most 512 KiB
    for item in items:
        assert item["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
        assert item["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "agentflows"
        assert all(len(v.encode()) <= status_store.PART_BYTES for v in item["data"].values())


async def test_deleting_the_flowrun_deletes_its_offloaded_outputs(
    control_plane: Cluster,
    kube: kube_client.Client,  # noqa: F811
    kube_namespace: str,  # noqa: F811
) -> None:
    st = await _new_run(kube, kube_namespace)
    await st.save_node("n", flowrun_api.NodeStatus(phase=Phase.SUCCEEDED, output="x" * 100_000))
    selector = f"agentflows.io/run={st.name}"
    configmaps = kube_client.path_of("configmaps", kube_namespace)
    assert (await kube.get(configmaps, labelSelector=selector))["items"]
    await kube.delete(kube_client.path_of("flowruns", kube_namespace, st.name))

    def collected() -> bool:
        found = control_plane.core().list_namespaced_config_map(
            kube_namespace, label_selector=selector
        )
        return not found.items

    await asyncio.to_thread(wait_for, collected, 120, "offloaded ConfigMaps to be collected")


async def test_nulls_inside_outputs_survive_and_a_rewrite_replaces_the_whole_record(
    kube: kube_client.Client,  # noqa: F811
    kube_namespace: str,  # noqa: F811
) -> None:
    st = await _new_run(kube, kube_namespace)
    await st.save_node(
        "a",
        flowrun_api.NodeStatus(
            phase=Phase.FAILED, error="boom", output={"json": {"old": 1, "gone": 2}}
        ),
    )
    await st.save_node(
        "a",
        flowrun_api.NodeStatus(
            phase=Phase.SUCCEEDED, output={"json": {"old": None, "list": [None]}, "raw": None}
        ),
    )
    loaded = await status_store.StatusStore(kube, kube_namespace, st.name, attempt=1).load()
    assert loaded.nodes["a"].output == {"json": {"old": None, "list": [None]}, "raw": None}
    assert loaded.nodes["a"].error is None


async def test_large_detail_and_errors_are_bounded_and_detail_comes_back_whole(
    kube: kube_client.Client,  # noqa: F811
    kube_namespace: str,  # noqa: F811
) -> None:
    st = await _new_run(kube, kube_namespace)
    conversation = [{"role": "user", "content": "q" * 1000} for _ in range(300)]
    await st.save_node(
        "agent",
        flowrun_api.NodeStatus(
            phase=Phase.WAITING, detail={"request": "agent", "state": conversation}
        ),
    )
    await st.save_node("bad", flowrun_api.NodeStatus(phase=Phase.FAILED, error="e" * 30000))
    obj = await get_flowrun(kube, kube_namespace, st.name)
    assert len(json.dumps(obj)) < 32 * 1024
    assert len(obj["status"]["nodes"]["bad"]["error"]) <= status_store.TEXT_LIMIT
    loaded = await status_store.StatusStore(kube, kube_namespace, st.name, attempt=1).load()
    assert loaded.nodes["agent"].detail == {"request": "agent", "state": conversation}


async def test_run_record_comes_from_the_flowrun_spec_and_start_time(
    kube: kube_client.Client,  # noqa: F811
    kube_namespace: str,  # noqa: F811
) -> None:
    name = unique("rec")
    trigger = {"type": "webhook", "name": "hook", "payload": {"id": 7}}
    await create_flowrun(kube, kube_namespace, name, input_value={"a": 1}, trigger=trigger)
    await patch_status(kube, kube_namespace, name, {"startTime": "2026-01-02T03:04:05Z"})
    loaded = await status_store.StatusStore(kube, kube_namespace, name, attempt=1).load()
    assert loaded.run is not None
    assert (loaded.run.input, loaded.run.trigger) == ({"a": 1}, trigger)
    assert loaded.run.started_at == "2026-01-02T03:04:05Z"


async def test_waiting_result_is_not_an_outcome_and_result_carries_the_attempt(
    kube: kube_client.Client,  # noqa: F811
    kube_namespace: str,  # noqa: F811
) -> None:
    st = await _new_run(kube, kube_namespace, attempt=2)
    await patch_status(kube, kube_namespace, st.name, {"attempt": 2})
    await st.save_outcome(store.Outcome(flowrun_api.RunPhase.WAITING, reason="Waiting"))
    obj = await get_flowrun(kube, kube_namespace, st.name)
    assert obj["status"]["result"]["attempt"] == 2
    assert obj["status"]["result"]["phase"] == "Waiting"
    assert obj["status"]["attempt"] == 2  # the operator's key is untouched
    assert (
        await status_store.StatusStore(kube, kube_namespace, st.name, attempt=1).load()
    ).outcome is None


class CountingClient(kube_client.Client):
    """Counts PATCH requests on FlowRun status (the cost of progress)."""

    patches = 0

    async def request(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        if method == "PATCH" and path.endswith("/status"):
            self.patches += 1
        return await super().request(method, path, body, **kwargs)


@pytest.mark.parametrize("length", [3, 10])
async def test_chain_of_transforms_costs_one_status_patch_per_node(
    control_plane: Cluster,
    crds: list[str],  # noqa: F811
    kube_namespace: str,  # noqa: F811
    length: int,
) -> None:
    nodes = "\n".join(f"  - {{id: n{i}, transform: '={i}'}}" for i in range(length))
    spec = flow_spec(f"nodes:\n{nodes}\n")
    async with CountingClient.from_env(str(control_plane.kubeconfig())) as api:
        name = unique("chain")
        await create_flowrun(api, kube_namespace, name)
        api.patches = 0
        st = status_store.StatusStore(api, kube_namespace, name, attempt=1)
        progress = runner_main.Progress(st)
        resolver = graph.StaticResolver()
        outcome = await run.run_flow(
            graph.compile_flow(spec, resolver),
            run_name=name,
            input_value=None,
            store_=st,
            caps=CountingHost(),
            resolver=resolver,
            observer=progress,
        )
        assert outcome.phase == flowrun_api.RunPhase.SUCCEEDED
        print(f"chain of {length} transforms: {api.patches} status patches")
        # one per node, plus save_run's and the outcome's
        assert api.patches == length + 2

"""The ConfigMaps a run reads come as one projected volume of its pod, never through the API.

The runner's identity has no ``get`` on ConfigMaps (config/rbac/runner/role.yaml): a read is
never seen by admission, so it could not be confined to the run. The operator lists what the
run reads in the pod (:func:`agentflows.controller.pods.config_map_volume`) and the runner reads
it from the volume (:mod:`agentflows.kube.mounted`). The same on the API server, with the
kubelet filling the volume: tests/cluster/test_runner_configmap_reach.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentflows.api import agent as agent_api
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.api import snapshot as snapshot_api
from agentflows.controller import flowruns, pods, settings
from agentflows.controller.runtime import workqueue
from agentflows.kube import mounted, status_store
from agentflows.kube import snapshot as snapshot_mod
from tests.support.fake_flowrun_api import FakeFlowRunApi, controller_on

REPO = Path(__file__).resolve().parents[2]

RUN: dict[str, Any] = {
    "apiVersion": "agentflows.io/v1alpha1",
    "kind": "FlowRun",
    "metadata": {"name": "answer-1", "namespace": "team", "uid": "0000-1111"},
    "status": {
        "outputRef": "configmap:answer-1-out-run0000000:1",
        "nodes": {
            "draft": {"phase": "Succeeded", "outputRef": "configmap:answer-1-out-aaaaaaaaaa:2"},
            "chat": {
                "phase": "Succeeded",
                "detail": {"$offloaded": "configmap:answer-1-out-bbbbbbbbbb:1"},
            },
            "small": {"phase": "Succeeded", "output": "inline"},
            "odd": {"phase": "Succeeded", "outputRef": "not a reference"},
        },
        "requests": {
            "review": {
                "node": "chat",
                "kind": "review",
                "proposal": {"$offloaded": "configmap:answer-1-out-cccccccccc:1"},
            },
        },
    },
}


def _flow() -> flow_api.FlowSpec:
    return flow_api.FlowSpec.model_validate(
        {
            "nodes": [
                {
                    "id": "draft",
                    "agent": {
                        "name": "writer",
                        "prompt": "Draft.",
                        "files": [{"configMapKeyRef": {"name": "style", "key": "guide.md"}}],
                    },
                }
            ],
            "runner": {"files": [{"name": "handbook", "configMap": {"name": "handbook"}}]},
        }
    )


def _agent() -> agent_api.AgentSpec:
    return agent_api.AgentSpec.model_validate(
        {
            "model": {"name": "openai/gpt-4o-mini"},
            "systemPrompt": "Write.",
            "files": [
                {"configMapKeyRef": {"name": "handbook", "key": "oncall.md"}},
                {"configMapKeyRef": {"name": "handbook", "key": "logo.bin"}},
            ],
        }
    )


def _sources(pod: dict[str, Any]) -> list[dict[str, Any]]:
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == mounted.VOLUME]
    return [source["configMap"] for source in volume["projected"]["sources"]]


def test_the_pod_mounts_the_snapshot_the_files_and_every_offloaded_part_each_at_name_slash_key() -> (
    None
):
    pod = pods.runner_pod(
        RUN,
        2,
        "answer",
        {"answer": _flow()},
        {"writer": _agent()},
        settings.OperatorConfig(),
        status=flowrun_api.status_of(RUN),
    )

    def item(name: str, *keys: str, optional: bool = True) -> dict[str, Any]:
        items = [{"key": key, "path": f"{name}/{key}"} for key in keys]
        return {"name": name, "items": items, **({"optional": True} if optional else {})}

    assert _sources(pod) == [
        item("answer-1-out-aaaaaaaaaa-0", "part-0000"),
        item("answer-1-out-aaaaaaaaaa-1", "part-0001"),
        item("answer-1-out-bbbbbbbbbb-0", "part-0000"),
        item("answer-1-out-cccccccccc-0", "part-0000"),
        item("answer-1-out-run0000000-0", "part-0000"),
        item("answer-1-snapshot", "snapshot.json", optional=False),
        item("handbook", "logo.bin", "oncall.md"),
        item("style", "guide.md"),
    ]
    [container] = pod["spec"]["containers"]
    assert {
        "name": mounted.VOLUME,
        "mountPath": "/var/run/agentflows/configmaps",
        "readOnly": True,
    } in container["volumeMounts"]


def test_a_first_attempt_mounts_only_the_snapshot_and_the_files() -> None:
    first = {**RUN, "status": {}}
    pod = pods.runner_pod(
        first,
        1,
        "answer",
        {"answer": _flow()},
        {},
        settings.OperatorConfig(),
        status=flowrun_api.status_of(first),
    )
    assert [s["name"] for s in _sources(pod)] == ["answer-1-snapshot", "style"]


def test_the_runner_role_may_write_its_runs_configmaps_but_not_read_any() -> None:
    role = yaml.safe_load((REPO / "config/rbac/runner/role.yaml").read_text())
    [rule] = [r for r in role["rules"] if "configmaps" in r["resources"]]
    assert "get" not in rule["verbs"] and "list" not in rule["verbs"]
    assert "watch" not in rule["verbs"]
    assert {"create", "patch"} <= set(rule["verbs"])


async def test_offloaded_values_are_read_back_from_the_volume_without_a_configmap_request(
    tmp_path: Path,
) -> None:
    api = FakeFlowRunApi("team", "r", status={"attempt": 2})
    text = json.dumps({"report": "x" * 50})
    api.configmaps["r-out-aaaaaaaaaa-0"] = {"data": {"part-0000": text[:20]}}
    api.configmaps["r-out-aaaaaaaaaa-1"] = {"data": {"part-0001": text[20:]}}
    api.flowrun["status"]["nodes"] = {
        "write": {"phase": "Succeeded", "outputRef": "configmap:r-out-aaaaaaaaaa:2"}
    }
    api.mount()
    async with api.client() as client:
        store = status_store.StatusStore(client, "team", "r", attempt=2, configmaps=api.mounted)
        checkpoint = await store.load()
    assert checkpoint.nodes["write"].output == {"report": "x" * 50}
    assert api.count("GET", "configmaps") == 0


async def test_an_offloaded_part_missing_from_the_volume_is_the_permanent_offload_error() -> None:
    api = FakeFlowRunApi("team", "r", status={"attempt": 2})
    api.flowrun["status"]["nodes"] = {
        "write": {"phase": "Succeeded", "outputRef": "configmap:r-out-aaaaaaaaaa:1"}
    }
    async with api.client() as client:
        store = status_store.StatusStore(client, "team", "r", attempt=2, configmaps=api.mounted)
        with pytest.raises(status_store.OffloadError, match="r-out-aaaaaaaaaa-0 is gone"):
            await store.load()


def _written(root: Path, text: str) -> mounted.Mounted:
    path = root / "r-snapshot" / snapshot_mod.SNAPSHOT_KEY
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return mounted.Mounted(root)


SNAPSHOT = json.dumps({"flow": "f", "flows": {"f": {"nodes": []}}, "agents": {}})
FLOWRUN = {"metadata": {"name": "r", "namespace": "team", "uid": "u"}}


def test_the_mounted_snapshot_is_used_only_with_the_content_status_snapshot_digest_names(
    tmp_path: Path,
) -> None:
    volume = _written(tmp_path, SNAPSHOT)
    own = {**FLOWRUN, "status": {"snapshotDigest": snapshot_api.digest_of(SNAPSHOT)}}
    assert snapshot_mod.read_mounted_snapshot(volume, own).flow == "f"

    planted = {**FLOWRUN, "status": {"snapshotDigest": snapshot_api.digest_of(SNAPSHOT + " ")}}
    with pytest.raises(snapshot_mod.SnapshotError, match="not the snapshot the operator wrote"):
        snapshot_mod.read_mounted_snapshot(volume, planted)
    with pytest.raises(snapshot_mod.SnapshotError, match="snapshotDigest is not set"):
        snapshot_mod.read_mounted_snapshot(volume, {**FLOWRUN, "status": {}})
    with pytest.raises(snapshot_mod.SnapshotError, match="missing from the pod"):
        snapshot_mod.read_mounted_snapshot(mounted.Mounted(tmp_path / "none"), own)


def test_a_name_or_key_that_would_leave_the_volume_reads_nothing(tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("outside")
    volume = mounted.Mounted(tmp_path / "volume")
    (tmp_path / "volume" / "cm").mkdir(parents=True)
    for name, key in [("..", "secret.txt"), ("cm", "../../secret.txt"), ("", "secret.txt")]:
        assert volume.read(name, key) is None


async def test_a_pod_the_operator_creates_for_an_attempt_reserved_earlier_mounts_the_offloaded_parts() -> (
    None
):
    # attempt 2 was reserved (by an operator since restarted, or before a refused create):
    # its pod is made from the cache, which keeps the run's status parsed, not in the object
    status = {
        "phase": "Pending",
        "attempt": 2,
        "pod": "r-2",
        "podCreated": 1,
        "startTime": "2026-12-02T13:00:00Z",
        "nodes": {"draft": {"phase": "Succeeded", "outputRef": "configmap:r-out-aaaaaaaaaa:1"}},
        "result": {"attempt": 1, "phase": "Waiting"},
    }
    fake = FakeFlowRunApi("team", "r", spec={"flow": "f"}, status=status)
    fake.snapshot({"nodes": [{"id": "draft", "transform": "=1"}]})
    async with controller_on(fake) as ctl:
        await flowruns.reconcile(ctl, workqueue.Key(workqueue.FLOWRUN, "team", "r"))

    [pod] = fake.pods.values()
    assert [s["name"] for s in _sources(pod)] == ["r-out-aaaaaaaaaa-0", "r-snapshot"]

"""Naming a Secret, ConfigMap or claim requires being allowed to read it (issues 11 and 19).

Real users of the dev control plane apply Agents and Flows with kubectl, as the README shows.
Both alice and mallory may edit agentflows resources in the namespace; only alice may `get` the
Secrets, ConfigMaps and claims named. The ValidatingAdmissionPolicy in
config/policies/secret-references.yaml (generated from agentflows.api.references) decides. Every
place a name can sit is tried (REFERENCES covers each pattern of the walk, as a test checks).
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.cluster.harness import REPO, Cluster, wait_for
from tests.cluster.kube_fixtures import crds

pytestmark = pytest.mark.cluster
__all__ = ["crds"]

POLICY = REPO / "config" / "policies" / "secret-references.yaml"
SECRETS = ("llm-keys", "mcp-token", "tool-token", "node-key", "map-token", "env-secret", "hook")
#: ConfigMaps and claims alice may get (mallory may not): they need not exist either.
CONFIG_MAPS = ("handbook", "node-notes", "map-notes", "volume-notes")
CLAIMS = ("docs",)
#: alice may get these too; they need not exist for the authorizer to answer.
GRANTED = (*SECRETS, *(f"extra-{i}" for i in range(13)))


@pytest.fixture(scope="module")
def policy(control_plane: Cluster, crds: list[str]) -> None:
    control_plane.kubectl("apply", "-f", str(POLICY))
    control_plane.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "test-agentflows-editor"},
            "rules": [
                {
                    "apiGroups": ["agentflows.io"],
                    "resources": ["agents", "flows", "flowruns"],
                    "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
                }
            ],
        }
    )


@pytest.fixture
def tenants(control_plane: Cluster, namespace: str, policy: None) -> str:
    """alice and mallory edit agentflows resources; only alice may get the Secrets."""
    for secret in SECRETS:
        control_plane.apply(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": secret, "namespace": namespace},
                "stringData": {"key": f"value-of-{secret}"},
            }
        )
    users = [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name}
        for name in ("alice", "mallory")
    ]
    control_plane.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "editors", "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "test-agentflows-editor",
            },
            "subjects": users,
        }
    )
    control_plane.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "read-keys", "namespace": namespace},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["secrets"],
                    "resourceNames": list(GRANTED),
                    "verbs": ["get"],
                },
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "resourceNames": list(CONFIG_MAPS),
                    "verbs": ["get"],
                },
                {
                    "apiGroups": [""],
                    "resources": ["persistentvolumeclaims"],
                    "resourceNames": list(CLAIMS),
                    "verbs": ["get"],
                },
            ],
        }
    )
    control_plane.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "read-keys", "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "read-keys",
            },
            "subjects": users[:1],
        }
    )

    def enforced() -> bool:
        # the policy reaches the admission plugin asynchronously: wait until it denies
        result = apply(control_plane, namespace, "mallory", agent("probe", api_key("llm-keys")))
        if result.returncode == 0:
            control_plane.kubectl("-n", namespace, "delete", "agent", "probe", check=False)
        return "references Secret llm-keys" in result.stderr

    wait_for(enforced, 60, "the secret-reference policy to be enforced")
    return namespace


def apply(cluster: Cluster, namespace: str, user: str, manifest: dict[str, Any]) -> Any:
    return cluster.kubectl(
        "-n", namespace, "apply", "-f", "-", user=user, stdin=json.dumps(manifest), check=False
    )


def api_key(secret: str) -> dict[str, Any]:
    return {"secretKeyRef": {"name": secret, "key": "key"}}


def agent(name: str, key: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    model: dict[str, Any] = {"name": "openai/gpt-4o-mini"}
    if key is not None:
        model["apiKey"] = key
    return {
        "apiVersion": "agentflows.io/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": name},
        "spec": {"model": model, **spec},
    }


def flow(name: str, nodes: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "agentflows.io/v1alpha1",
        "kind": "Flow",
        "metadata": {"name": name},
        "spec": {"nodes": nodes or [{"id": "a", "transform": "=1"}], **spec},
    }


def file_of(source: str, name: str) -> dict[str, Any]:
    return {"name": "notes.txt", source: {"name": name, "key": "key"}}


def agent_node(node_id: str, file: dict[str, Any]) -> dict[str, Any]:
    return {"id": node_id, "agent": {"name": "helper", "prompt": "hi", "files": [file]}}


def map_agent_node(node_id: str, file: dict[str, Any]) -> dict[str, Any]:
    call = {"name": "helper", "prompt": "hi", "files": [file]}
    return {"id": node_id, "map": {"items": "=[1]", "agent": call}}


HTTP = {"url": "http://127.0.0.1:9/x", "secretHeaders": {"Authorization": api_key("tool-token")}}
REFERENCES = {
    "agent apiKey": ("llm-keys", agent("a1", api_key("llm-keys"))),
    "agent mcp header": (
        "mcp-token",
        agent(
            "a2",
            tools=[
                {
                    "name": "search",
                    "mcp": {
                        "url": "http://127.0.0.1:9/mcp",
                        "headers": {"X": api_key("mcp-token")},
                    },
                }
            ],
        ),
    ),
    "agent http secretHeaders": ("tool-token", agent("a3", tools=[{"name": "t", "http": HTTP}])),
    "flow llm apiKey": (
        "node-key",
        flow(
            "f1",
            [
                {
                    "id": "ask",
                    "llm": {
                        "model": {"name": "openai/gpt-4o-mini", "apiKey": api_key("node-key")},
                        "prompt": "hi",
                    },
                }
            ],
        ),
    ),
    "flow inline http tool": ("tool-token", flow("f2", [{"id": "call", "tool": {"http": HTTP}}])),
    "flow map http tool": (
        "map-token",
        flow(
            "f3",
            [
                {
                    "id": "each",
                    "map": {
                        "items": "=[1]",
                        "tool": {
                            "http": {
                                "url": "http://127.0.0.1:9/x",
                                "secretHeaders": {"X": api_key("map-token")},
                            }
                        },
                    },
                }
            ],
        ),
    ),
    "flow runner env": (
        "env-secret",
        flow(
            "f4",
            runner={"env": [{"name": "X", "secretKeyRef": {"name": "env-secret", "key": "key"}}]},
        ),
    ),
    "flow webhook trigger": (
        "hook",
        flow(
            "f5",
            triggers=[{"name": "push", "webhook": {"secret": {"name": "hook", "key": "key"}}}],
        ),
    ),
    "agent files secretKeyRef": (
        "llm-keys",
        agent("a4", files=[file_of("secretKeyRef", "llm-keys")]),
    ),
    "agent files configMapKeyRef": (
        "ConfigMap handbook",
        agent("a5", files=[file_of("configMapKeyRef", "handbook")]),
    ),
    "flow inline mcp header": (
        "mcp-token",
        flow(
            "f6",
            [
                {
                    "id": "call",
                    "tool": {
                        "name": "search",
                        "mcp": {
                            "url": "http://127.0.0.1:9/mcp",
                            "headers": {"X": api_key("mcp-token")},
                        },
                    },
                }
            ],
        ),
    ),
    "flow map inline mcp header": (
        "map-token",
        flow(
            "f7",
            [
                {
                    "id": "each",
                    "map": {
                        "items": "=[1]",
                        "tool": {
                            "name": "search",
                            "mcp": {
                                "url": "http://127.0.0.1:9/mcp",
                                "headers": {"X": api_key("map-token")},
                            },
                        },
                    },
                }
            ],
        ),
    ),
    "flow agent node files secretKeyRef": (
        "node-key",
        flow("f8", [agent_node("ask", file_of("secretKeyRef", "node-key"))]),
    ),
    "flow agent node files configMapKeyRef": (
        "ConfigMap node-notes",
        flow("f9", [agent_node("ask", file_of("configMapKeyRef", "node-notes"))]),
    ),
    "flow map agent files secretKeyRef": (
        "tool-token",
        flow("f10", [map_agent_node("each", file_of("secretKeyRef", "tool-token"))]),
    ),
    "flow map agent files configMapKeyRef": (
        "ConfigMap map-notes",
        flow("f11", [map_agent_node("each", file_of("configMapKeyRef", "map-notes"))]),
    ),
    "flow runner files configMap": (
        "ConfigMap volume-notes",
        flow("f12", runner={"files": [{"name": "notes", "configMap": {"name": "volume-notes"}}]}),
    ),
    "flow runner files claim": (
        "PersistentVolumeClaim docs",
        flow(
            "f13",
            runner={"files": [{"name": "docs", "persistentVolumeClaim": {"claimName": "docs"}}]},
        ),
    ),
}


@pytest.mark.parametrize("where", list(REFERENCES))
def test_a_user_who_cannot_get_a_secret_cannot_reference_it(
    control_plane: Cluster, tenants: str, where: str
) -> None:
    named, manifest = REFERENCES[where]
    kind, name = named.split(" ") if " " in named else ("Secret", named)
    denied = apply(control_plane, tenants, "mallory", manifest)
    assert denied.returncode != 0
    assert (
        f"this {manifest['kind']} references {kind} {name}, which mallory may not get in"
        f" namespace {tenants}: referencing a {kind} requires permission to read it"
    ) in denied.stderr
    allowed = apply(control_plane, tenants, "alice", manifest)
    assert allowed.returncode == 0, allowed.stderr


def test_an_update_cannot_add_a_reference_or_repoint_someone_elses(
    control_plane: Cluster, tenants: str
) -> None:
    assert apply(control_plane, tenants, "mallory", agent("mine")).returncode == 0
    added = apply(control_plane, tenants, "mallory", agent("mine", api_key("llm-keys")))
    assert "references Secret llm-keys" in added.stderr

    assert (
        apply(control_plane, tenants, "alice", agent("shared", api_key("llm-keys"))).returncode == 0
    )
    repointed = agent("shared", api_key("llm-keys"))
    repointed["spec"]["model"]["apiBase"] = "http://127.0.0.1:9/evil"
    denied = apply(control_plane, tenants, "mallory", repointed)
    assert "references Secret llm-keys" in denied.stderr

    labelled = _kubectl(control_plane, tenants, "mallory", "label", "agent", "shared", "team=x")
    assert labelled.returncode == 0, labelled.stderr  # metadata only: not a new reference


def _kubectl(
    cluster: Cluster, namespace: str, user: str, *args: str
) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("-n", namespace, *args, user=user, check=False)


def test_repeated_references_are_checked_once_and_too_many_are_refused(
    control_plane: Cluster, tenants: str
) -> None:
    def tools(names: list[str]) -> list[dict[str, Any]]:
        return [
            {
                "name": f"t{i}",
                "http": {"url": "http://127.0.0.1:9/x", "secretHeaders": {"X": api_key(n)}},
            }
            for i, n in enumerate(names)
        ]

    repeated = [*SECRETS, *SECRETS, "unlisted"]  # alice may get all but the last
    denied = apply(control_plane, tenants, "alice", agent("many", tools=tools(repeated)))
    assert "references Secret unlisted, which alice may not get" in denied.stderr
    allowed = apply(control_plane, tenants, "alice", agent("many", tools=tools(repeated[:-1])))
    assert allowed.returncode == 0, allowed.stderr

    # twenty distinct Secrets: twenty authorizer calls fit the policy's CEL cost budget
    twenty = apply(control_plane, tenants, "alice", agent("twenty", tools=tools(list(GRANTED))))
    assert twenty.returncode == 0, twenty.stderr

    late = [*(["llm-keys"] * 20), "hook"]
    refused = apply(control_plane, tenants, "alice", agent("late", tools=tools(late)))
    assert (
        "references Secret hook only after 20 other references, and at most 20 are checked"
        in refused.stderr
    )

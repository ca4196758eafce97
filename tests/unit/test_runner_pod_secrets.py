"""The Secrets a run names reach its runner pod as files of one volume, never as env variables.

A process ``kubectl exec`` starts in a container inherits the container's environment, so a key
put there is anyone's with ``pods/exec``; the runner reads the volume's files instead, and its
tools cannot (tests/unit/security/test_attack_python_tool.py; on the real node:
tests/cluster/test_runner_pod_restrictions.py).
"""

from __future__ import annotations

from agentflows.api import agent as agent_api
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.api import runner as runner_api
from agentflows.controller import pods, settings

RUN = {
    "apiVersion": "agentflows.io/v1alpha1",
    "kind": "FlowRun",
    "metadata": {"name": "answer-1", "namespace": "team", "uid": "0000-1111"},
}
#: The status of a run whose pod is its first: nothing offloaded yet.
NO_STATUS = flowrun_api.FlowRunStatus()


def test_a_models_key_is_a_read_only_file_of_the_secrets_volume_and_in_no_env_variable() -> None:
    agent = agent_api.AgentSpec.model_validate(
        {
            "model": {
                "name": "openai/gpt-4o-mini",
                "apiKey": {"secretKeyRef": {"name": "llm-keys", "key": "openai"}},
            },
            "tools": [
                {
                    "name": "search",
                    "mcp": {
                        "url": "http://search.tools:8080/mcp",
                        "headers": {
                            "X-Token": {"secretKeyRef": {"name": "llm-keys", "key": "mcp"}}
                        },
                    },
                }
            ],
        }
    )
    flow = flow_api.FlowSpec.model_validate(
        {
            "nodes": [{"id": "ask", "agent": {"name": "helper", "prompt": "hi"}}],
            "runner": {"env": [{"name": "OWN", "secretKeyRef": {"name": "mine", "key": "k"}}]},
        }
    )

    pod = pods.runner_pod(
        RUN,
        1,
        "answer",
        {"answer": flow},
        {"helper": agent},
        settings.OperatorConfig(),
        status=NO_STATUS,
    )

    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == pods.SECRETS_VOLUME]
    assert volume == {
        "name": "secrets",
        "projected": {
            "defaultMode": 0o440,
            "sources": [
                {
                    "secret": {
                        "name": "llm-keys",
                        "items": [
                            {"key": "mcp", "path": "llm-keys/mcp"},
                            {"key": "openai", "path": "llm-keys/openai"},
                        ],
                    }
                }
            ],
        },
    }
    [container] = pod["spec"]["containers"]
    assert {
        "name": "secrets",
        "mountPath": runner_api.RUNNER_SECRETS_ROOT,
        "readOnly": True,
    } in container["volumeMounts"]
    # Only what the Flow itself asked to have in the environment is there.
    from_secrets = [e["name"] for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})]
    assert from_secrets == ["OWN"]


def test_a_run_naming_no_secret_has_no_secrets_volume() -> None:
    flow = flow_api.FlowSpec.model_validate({"nodes": [{"id": "only", "transform": "."}]})
    pod = pods.runner_pod(
        RUN, 1, "answer", {"answer": flow}, {}, settings.OperatorConfig(), status=NO_STATUS
    )
    assert pods.SECRETS_VOLUME not in [v["name"] for v in pod["spec"]["volumes"]]
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["tmp", "run-configmaps"]

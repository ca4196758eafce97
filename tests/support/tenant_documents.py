"""Documents a tenant writes to set the operator's own variables (issue 19, item 27).

Both are refused, naming the field: by ``agentflows validate`` and the models in the unit tier
(``tests/unit/test_operator_env.py``), by the API server's CEL in the cluster tier
(``tests/cluster/test_attack_tenant_bounds.py``).
"""

from __future__ import annotations

from typing import Any


def flow_emptying_the_budget() -> dict[str, Any]:
    """A Flow ``spend`` whose ``spec.runner.env[0]`` empties ``AGENTFLOWS_BUDGET``."""
    return {
        "apiVersion": "agentflows.io/v1alpha1",
        "kind": "Flow",
        "metadata": {"name": "spend"},
        "spec": {
            "nodes": [{"id": "a", "transform": "=1"}],
            "runner": {"env": [{"name": "AGENTFLOWS_BUDGET", "value": ""}]},
        },
    }


def agent_setting_the_attempt() -> dict[str, Any]:
    """An Agent ``tools`` whose stdio server (``spec.tools[0].mcp``) sets ``AGENTFLOWS_ATTEMPT``."""
    return {
        "apiVersion": "agentflows.io/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": "tools"},
        "spec": {
            "model": {"name": "openai/gpt-4o-mini"},
            "tools": [
                {"name": "srv", "mcp": {"command": "srv", "env": {"AGENTFLOWS_ATTEMPT": "9"}}}
            ],
        },
    }

"""The runner pod's ``AGENTFLOWS_*`` variables are the operator's alone (issue 19, item 27).

A Flow's ``runner.env`` once overrode ``AGENTFLOWS_BUDGET`` (an empty value let a run spend past
its namespace's Budget). The models (so ``agentflows validate`` and the CRDs' CEL) refuse such a
name with its path, and the pod builder never lets one through, even from a Flow stored before
the rule existed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from agentflows.api import budget as budget_api
from agentflows.api import crd
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.api import runner as runner_api
from agentflows.cli import main as cli
from agentflows.controller import pods, settings
from tests.support import tenant_documents

RUN = {
    "apiVersion": "agentflows.io/v1alpha1",
    "kind": "FlowRun",
    "metadata": {"name": "spend-1", "namespace": "team", "uid": "0000-1111"},
}
REFUSED = "variables starting with AGENTFLOWS_ are set by the operator and cannot be set"


def _validate(tmp_path: Path, document: dict[str, Any]) -> tuple[int, str]:
    path = tmp_path / "doc.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "agentflows.io/v1alpha1", **document}))
    result = CliRunner().invoke(cli.main, ["validate", str(path)])
    return result.exit_code, result.stdout + result.stderr


def test_validate_refuses_a_flow_runner_env_of_the_operators_with_its_path(tmp_path: Path) -> None:
    code, out = _validate(tmp_path, tenant_documents.flow_emptying_the_budget())
    assert code == 2
    assert f"spec.runner.env[0].name: 'AGENTFLOWS_BUDGET': {REFUSED}" in out


def test_validate_refuses_an_agent_stdio_server_env_of_the_operators_with_its_path(
    tmp_path: Path,
) -> None:
    code, out = _validate(tmp_path, tenant_documents.agent_setting_the_attempt())
    assert code == 2
    assert f"spec.tools[0].mcp.env: 'AGENTFLOWS_ATTEMPT': {REFUSED}" in out


def test_the_crds_carry_the_same_rule_for_the_api_server() -> None:
    by_kind = {resource.kind: resource for resource in crd.RESOURCES}
    flows = json.dumps(crd.build_crd(by_kind["Flow"]))
    agents = json.dumps(crd.build_crd(by_kind["Agent"]))
    assert "!self.name.startsWith('AGENTFLOWS_')" in flows
    assert "self.env.all(k, !k.startsWith('AGENTFLOWS_'))" in agents


def test_a_stored_flow_cannot_override_the_operators_variables_in_the_pod() -> None:
    # a Flow written before the rule: built without validation, as an old object is read
    env = [
        runner_api.EnvVar.model_construct(name="AGENTFLOWS_BUDGET", value="", secret_key_ref=None),
        runner_api.EnvVar.model_construct(
            name="AGENTFLOWS_ATTEMPT", value="99", secret_key_ref=None
        ),
        runner_api.EnvVar.model_construct(name="TEAM", value="blue", secret_key_ref=None),
    ]
    flow = flow_api.FlowSpec.model_validate({"nodes": [{"id": "a", "transform": "=1"}]})
    flow.runner.env = env
    budget = budget_api.RunBudget(max_tokens=1000, tokens_by="team/day")

    pod = pods.runner_pod(
        RUN,
        2,
        "spend",
        {"spend": flow},
        {},
        settings.OperatorConfig(),
        status=flowrun_api.status_of(RUN),
        budget=budget,
    )

    [container] = pod["spec"]["containers"]
    names = [var["name"] for var in container["env"]]
    values = {var["name"]: var.get("value") for var in container["env"]}
    assert names.count("AGENTFLOWS_BUDGET") == 1
    assert names.count("AGENTFLOWS_ATTEMPT") == 1
    assert values["AGENTFLOWS_BUDGET"] == budget.model_dump_json(exclude_none=True)
    assert values["AGENTFLOWS_ATTEMPT"] == "2"
    assert values["TEAM"] == "blue"
    # the operator's variables come after the Flow's: the last of a name wins in a pod
    assert names.index("TEAM") < names.index("AGENTFLOWS_ATTEMPT")

"""The runner's admission policy protects exactly the status keys the operator writes.

``config/policies/runner_own_run.yaml`` spells the operator's keys out (CEL cannot read Python);
``controller/runstate.OPERATOR_FIELDS`` is what the operator writes. A key in one and not the
other is either a key a runner could forge (``attemptsLost`` reset, so a run retries for ever)
or a key the policy guards that nobody writes.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from agentflows.api import common
from agentflows.api.flowrun import FlowRunStatus
from agentflows.controller import runstate

POLICY = Path(__file__).parents[2] / "config" / "policies" / "runner_own_run.yaml"


def test_the_runner_policy_guards_every_status_key_the_operator_writes_and_no_other() -> None:
    policy = next(d for d in yaml.safe_load_all(POLICY.read_text()) if d["kind"].endswith("Policy"))
    (expression,) = [
        v["expression"] for v in policy["spec"]["variables"] if v["name"] == "operatorKeysChanged"
    ]
    listed = re.search(r"\[([^\]]*)\]", expression)
    assert listed is not None, expression
    guarded = {key.strip().strip("'") for key in listed.group(1).split(",")}
    written = {common.wire_name(FlowRunStatus, f) for f in runstate.OPERATOR_FIELDS}
    assert guarded == written
    assert "attemptsLost" in guarded

"""Bounds that keep one tenant's runs from slowing the others (issue 19, item 31).

A run's ``spec.input`` is held in the operator's memory while the run is active: one over
``MAX_INPUT_BYTES`` is refused by ``agentflows start`` before any API call, and fails the run at
once through the operator (tests/cluster/test_attack_tenant_bounds.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from agentflows.api import flowrun
from agentflows.cli import main as cli


def test_an_input_of_exactly_the_limit_is_a_valid_run_input_and_one_byte_more_is_not() -> None:
    padding = flowrun.MAX_INPUT_BYTES - len('{"x":""}')
    assert flowrun.input_size_problem({"x": "a" * padding}) is None
    problem = flowrun.input_size_problem({"x": "a" * (padding + 1)})
    assert problem == (
        f"spec.input: {flowrun.MAX_INPUT_BYTES + 1} bytes of JSON, over the "
        f"{flowrun.MAX_INPUT_BYTES} a run's input may hold; pass larger data by reference "
        "(a ConfigMap, a URL)"
    )


def test_start_refuses_an_input_over_the_limit_before_any_api_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the kubeconfig names a port where nothing listens: a call would fail otherwise
    config = {
        "apiVersion": "v1",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    (tmp_path / "config").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "config"))
    big = json.dumps({"document": "a" * 1_200_000})
    result = CliRunner().invoke(cli.main, ["start", "triage", "--input-json", big])
    assert result.exit_code == 2, result.output
    assert "--input/--input-json: 1200015 bytes of JSON, over the 262144 a run's input" in (
        result.stderr
    )

"""Strings that become paths, commands, arguments or environment refuse NUL (issue 19, item 7).

A ``files`` ``path`` with a NUL byte passed ``validate`` and then exited 70 ("embedded null
byte") when the agent read it: every such field now says so at validation, with its path.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from agentflows.cli import main as cli

AGENT = "apiVersion: agentflows.io/v1alpha1\nkind: Agent\nmetadata: {name: a}\nspec:\n"
AGENT += "  model: {name: openai/gpt-4o-mini}\n"
FLOW = "---\napiVersion: agentflows.io/v1alpha1\nkind: Flow\nmetadata: {name: f}\nspec:\n"
MESSAGE = "must not contain a NUL character (\\0)"

CASES = {
    "files-path": (AGENT + '  files: [{path: "notes\\0.txt"}]\n', "spec.files[0].path"),
    "mcp-command": (
        AGENT + '  tools: [{name: t, mcp: {command: "srv\\0"}}]\n',
        "spec.tools[0].mcp.command",
    ),
    "mcp-args": (
        AGENT + '  tools: [{name: t, mcp: {command: srv, args: ["-x\\0"]}}]\n',
        "spec.tools[0].mcp.args[0]",
    ),
    "mcp-env": (
        AGENT + '  tools: [{name: t, mcp: {command: srv, env: {A: "b\\0"}}}]\n',
        "spec.tools[0].mcp.env.A",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_nul_byte_in_a_field_that_becomes_a_path_is_exit_2_with_the_field(
    tmp_path: Path, case: str
) -> None:
    text, where = CASES[case]
    path = tmp_path / "flow.yaml"
    path.write_text(text + FLOW + "  nodes: [{id: n, agent: {name: a, prompt: hi}}]\n")
    for command in (["validate", str(path)], ["run", str(path), "--state-dir", str(tmp_path)]):
        result = CliRunner().invoke(cli.main, command, env={"OPENAI_API_KEY": "sk-x"})
        assert not isinstance(result.exception, ValueError), result.exception
        assert result.exit_code == 2, result.output
        assert f"(Agent a): {where}" in result.output
        assert MESSAGE in result.output

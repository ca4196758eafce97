"""What ``agentflows runner`` loads before its first node: nothing the first node does not need.

A runner pod's start counts (issue 13: process start -> first model request). The runner's
command is dispatched before the rest of the CLI is imported (:mod:`agentflows.cli.entry`),
and a pod's kubeconfig is read without the ``kubernetes`` package; litellm, mcp, kopf,
jsonschema and the CLI's other commands are imported only where they are used, and the optional
parts of httpx and httpcore (rich, pygments, h2) not at all. The agent loop and the session
modules wait for an agent node (an ``llm`` node's request needs neither; issue 25).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

#: Modules a runner with an OpenAI-compatible llm node must not import before its first node.
NOT_BEFORE_THE_FIRST_NODE = (
    "agentflows.agents.handoff",
    "agentflows.agents.sessions",
    "agentflows.agents.spec_tools",
    "agentflows.agents.turn",
    "agentflows.agentspec",
    "agentflows.api.agentsession",
    "agentflows.cli.main",
    "agentflows.cli.local",
    "agentflows.controller",
    "h2",
    "jsonschema",
    "kopf",
    "kubernetes",
    "litellm",
    "mcp",
    "pygments",
    "rich",
)

STARTS = """
import json, sys
sys.argv = ["agentflows", "runner", "--help"]
from agentflows.cli import entry
try:
    entry.main()
except SystemExit:
    pass
from agentflows.runner import main
from agentflows.agents import host, model
from agentflows.kube import kubeconfig
kubeconfig.load({kubeconfig!r})
print(json.dumps(sorted(m for m, module in sys.modules.items() if module is not None)))
"""


def test_the_runner_command_loads_none_of_the_heavy_modules_before_its_first_node(
    tmp_path: Path,
) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "pod", "user": {"token": "t"}}],
        "contexts": [{"name": "pod", "context": {"cluster": "c", "user": "pod"}}],
        "current-context": "pod",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [sys.executable, "-c", STARTS.format(kubeconfig=str(path))],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "agentflows runner" in done.stdout.splitlines()[0]
    loaded = json.loads(done.stdout.splitlines()[-1])
    heavy = sorted(
        {
            m
            for m in loaded
            for prefix in NOT_BEFORE_THE_FIRST_NODE
            if m == prefix or m.startswith(prefix + ".")
        }
    )
    assert heavy == []


#: Counts the garbage collections that run while ``agentflows.runner.main`` is not imported yet.
COLLECTIONS = """
import gc, sys
collections = 0


def count(phase, info):
    global collections
    module = sys.modules.get("agentflows.runner.main")
    if phase == "start" and (module is None or module.__spec__._initializing):
        collections += 1


sys.argv = ["agentflows", "runner", "--help"]
from agentflows.cli import entry

gc.callbacks.append(count)
try:
    entry.main()
except SystemExit:
    pass
from agentflows.runner import main
print(collections, gc.isenabled())
"""


def test_the_runner_command_imports_what_it_runs_without_garbage_collections() -> None:
    done = subprocess.run(
        [sys.executable, "-c", COLLECTIONS], capture_output=True, text=True, check=True
    )
    # about a hundred collections before the collector was off while entry.main imports
    assert done.stdout.splitlines()[-1] == "0 True"

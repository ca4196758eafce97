"""What ``agentflows run`` loads before its first node starts: what that node needs, no more.

The CLI's start -> first node is measured by ``bench/engine.py`` (issue 25). Here the real
console script's ``main`` runs a flow in a subprocess whose stderr is wrapped: when the first
progress line (``… <node> (<kind>)``, the line the bench times) is written, the wrapper
records ``sys.modules``. The other commands' modules load only when they run
(:class:`agentflows.cli.group.Group`'s ``lazy``), the host's agent-turn modules only in an agent
node, and litellm, kubernetes, the MCP SDK and the console never before a first node.

What is imported is also not built or collected more than it must be: an API model's validator
is built when the model is first used (``defer_build`` on ``ApiModel``), so a Flow without
Agents builds no Agent model; and :mod:`agentflows.cli.entry` imports the command's modules
with the garbage collector off, then freezes them and turns it back on for the command.

Two lists, because a list of what may not load only catches what someone thought of: the
libraries that may load before the first node (:data:`LIBRARIES_BEFORE_THE_FIRST_NODE`, each
with why the first node needs it; any other third-party package fails the test, whatever it
is), and the heavy modules named with the cost that keeps them out
(:data:`NOT_BEFORE_THE_FIRST_NODE`). The moment is the first node's start, which the engine
tells its observer and the CLI's observer writes as the ``…`` line before the node runs: no
timing, no waiting.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest

from agentflows.cli import main as cli
from tests.support import loaded_modules

ROOT = Path(__file__).resolve().parents[2]

#: Runs the console script's main with stderr wrapped; argv[1] is where the facts go: the
#: modules loaded and the API models built when the first node starts, whether the collector
#: is on then, and how many collections ran while ``agentflows.cli.main`` was being imported.
RECORDING = """
import gc, json, sys

out = sys.argv.pop(1)
collections_while_importing = 0


def importing_the_command():
    module = sys.modules.get("agentflows.cli.main")
    return module is None or module.__spec__._initializing


def count(phase, info):
    global collections_while_importing
    if phase == "start" and importing_the_command():
        collections_while_importing += 1


def subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from subclasses(sub)


class FirstNode:
    def __init__(self, stream):
        self.stream, self.seen = stream, False

    def write(self, text):
        if not self.seen and "\\u2026" in text:
            self.seen = True
            from agentflows.api import common

            built = {
                f"{c.__module__}.{c.__qualname__}"
                for c in subclasses(common.ApiModel)
                if c.__pydantic_complete__
            }
            facts = {
                "modules": sorted(m for m, v in sys.modules.items() if v is not None),
                "built": sorted(built),
                "collector_on": gc.isenabled(),
                "collections_while_importing": collections_while_importing,
            }
            with open(out, "w") as f:
                json.dump(facts, f)
        return self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


sys.stderr = FirstNode(sys.stderr)
sys.argv[0] = "agentflows"
from agentflows.cli import entry

gc.callbacks.append(count)
entry.main()
"""

#: Never loaded by ``agentflows run`` before its first node, whatever the flow; each costs
#: from milliseconds to a second of imports (or of schema building) that a first node of these
#: flows does not use.
NOT_BEFORE_THE_FIRST_NODE = (
    # the other commands, and what only they use
    "agentflows.cli.builder_tools",
    "agentflows.cli.commands_cluster",
    "agentflows.cli.commands_draft",
    "agentflows.cli.commands_graph",
    "agentflows.cli.commands_runs",
    "agentflows.cli.commands_sessions",
    "agentflows.cli.console_command",
    "agentflows.cli.hints",
    "agentflows.console",
    "agentflows.controller",
    "agentflows.kube",
    "agentflows.runner",
    "agentflows.triggers",
    "agentflows.api.crd",  # the CRDs' JSON Schemas: pydantic's schema generation
    # Agent Spec's own models (TypeAdapters built on import): only for an Agent Spec file
    "agentflows.agentspec.model",
    "agentflows.agentspec.importer",
    "agentflows.agentspec.exporter",
    # sessions: an agent with memory, at its first turn
    "agentflows.agents.sessions",
    "agentflows.api.agentsession",
    # model providers and their clients: about a second for litellm alone
    "litellm",
    "openai",
    "tiktoken",
    "tokenizers",
    # HTTP stacks: model calls, http tools, MCP, reference files by URL
    "aiohttp",
    "httpx",
    "httpcore",
    "anyio",
    "h2",
    "rich",
    "pygments",
    "mcp",
    # Kubernetes clients and the operator's
    "kopf",
    "kubernetes",
    "prometheus_client",
    # tracing, only when OTEL_EXPORTER_OTLP_ENDPOINT is set (the test's environment has none)
    "opentelemetry",
    # JSON Schema validation: the plain input schemas of these flows are checked without it
    # (api/schemas.py), about 40 ms of imports
    "jsonschema",
    "referencing",
    "rpds",
    # printing the run's result, after it ran
    "orjson",
)

#: The only third-party packages ``agentflows run`` may load before its first node, and why
#: that node needs them. Any other one fails the test: add it here only with its reason.
LIBRARIES_BEFORE_THE_FIRST_NODE = {
    "click": "the command itself",
    "yaml": "reading the files (libyaml's parser, api/kubeyaml.py)",
    "pydantic": "validating the Flow against the API models",
    "pydantic_core": "pydantic's validators",
    "annotated_types": "pydantic's field constraints",
    "typing_extensions": "pydantic",
    "typing_inspection": "pydantic",
    "jq": "compiling the Flow's expressions, evaluating the first node's",
}

#: Loaded by an agent node (or a tool node's call), not by a flow that starts with a transform.
AGENT_TURNS = (
    "agentflows.agents.approval",
    "agentflows.agents.delegation",
    "agentflows.agents.handoff",
    "agentflows.agents.spec_tools",
    "agentflows.agents.tools",
    "agentflows.agents.turn",
)

#: API models whose validators hello.yaml (a Flow, no Agent, no session) never needs before its
#: first node; each costs milliseconds of schema building when built.
NOT_BUILT_FOR_A_FLOW_WITHOUT_AGENTS = (
    "agentflows.api.agent.Agent",
    "agentflows.api.agent.AgentSpec",
    "agentflows.api.agentsession.AgentSession",
    "agentflows.api.agentsession.AgentSessionSpec",
    "agentflows.api.flowrun.FlowRun",
    "agentflows.api.flowrun.FlowRunStatus",
)

#: A flow with neither an input schema nor a model: not even jsonschema is needed.
NO_SCHEMA_FLOW = """
apiVersion: agentflows.io/v1alpha1
kind: Flow
metadata: {name: plain}
spec:
  nodes:
    - {id: first, transform: '="hi"'}
"""


def facts_at_first_node(tmp_path: Path, *args: str) -> dict[str, Any]:
    """What RECORDING saw when ``agentflows run ARGS`` printed its first node-started line."""
    out = tmp_path / "facts.json"
    state = tmp_path / "state"
    # no tracing: OTEL_EXPORTER_OTLP_ENDPOINT would (rightly) load opentelemetry first
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", RECORDING, str(out), "run", *args, "--state-dir", str(state)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        encoding="utf-8",
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert out.exists(), f"no node-started line on stderr:\n{done.stderr}"
    facts: dict[str, Any] = json.loads(out.read_text())
    return facts


def modules_at_first_node(tmp_path: Path, *args: str) -> set[str]:
    """The modules loaded when ``agentflows run ARGS`` prints its first node-started line."""
    return set(facts_at_first_node(tmp_path, *args)["modules"])


@pytest.mark.parametrize(
    "args",
    [
        ("examples/hello.yaml", "--input", "name=Ada"),  # no model: the live capabilities
        ("examples/triage.yaml", "--input", "title=API latency above SLO"),  # the mock model
    ],
    ids=["hello", "triage"],
)
def test_agentflows_run_loads_no_other_command_nor_heavy_library_before_its_first_node(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    modules = modules_at_first_node(tmp_path, *args)
    assert "agentflows.cli.main" in modules  # the wrapper saw the real command's first node
    assert loaded_modules.loaded_of(modules, NOT_BEFORE_THE_FIRST_NODE) == []


@pytest.mark.parametrize(
    "args",
    [
        ("examples/hello.yaml", "--input", "name=Ada"),
        ("examples/triage.yaml", "--input", "title=API latency above SLO"),
    ],
    ids=["hello", "triage"],
)
def test_agentflows_run_loads_no_library_but_those_its_first_node_needs(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    modules = modules_at_first_node(tmp_path, *args)
    assert loaded_modules.third_party(modules) - set(LIBRARIES_BEFORE_THE_FIRST_NODE) == set()


def test_a_flow_starting_with_a_transform_loads_no_agent_turn_module_before_it(
    tmp_path: Path,
) -> None:
    modules = modules_at_first_node(tmp_path, "examples/hello.yaml", "--input", "name=Ada")
    assert "agentflows.agents.host" in modules  # its tool node runs on the live capabilities
    assert loaded_modules.loaded_of(modules, AGENT_TURNS) == []


def test_a_flow_without_schemas_loads_no_json_schema_validator_before_its_first_node(
    tmp_path: Path,
) -> None:
    flow = tmp_path / "plain.yaml"
    flow.write_text(NO_SCHEMA_FLOW)
    modules = modules_at_first_node(tmp_path, str(flow))
    assert (
        loaded_modules.loaded_of(modules, ("jsonschema", "referencing", "agentflows.agents.model"))
        == []
    )


def test_a_flow_without_agents_builds_no_agent_session_nor_flowrun_model_before_its_first_node(
    tmp_path: Path,
) -> None:
    facts = facts_at_first_node(tmp_path, "examples/hello.yaml", "--input", "name=Ada")
    built = set(facts["built"])
    assert "agentflows.api.flow.Flow" in built  # the file's Flow was validated
    assert loaded_modules.loaded_of(built, NOT_BUILT_FOR_A_FLOW_WITHOUT_AGENTS) == []


def test_the_command_modules_are_imported_without_garbage_collections_and_run_with_them(
    tmp_path: Path,
) -> None:
    facts = facts_at_first_node(tmp_path, "examples/hello.yaml", "--input", "name=Ada")
    assert facts["collections_while_importing"] == 0
    assert facts["collector_on"] is True


def test_every_command_loaded_when_it_runs_is_listed_and_found_by_its_name() -> None:
    ctx = click.Context(cli.main)
    names = cli.main.list_commands(ctx)
    assert {"start", "get", "import", "graph", "draft", "runner", "console", "sessions"} <= set(
        names
    )
    for name in names:
        command = cli.main.get_command(ctx, name)
        assert command is not None and command.name == name

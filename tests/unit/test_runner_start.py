"""What ``agentflows runner`` loads before its first node: nothing the first node does not need.

A runner pod's start counts (issue 13: process start -> first model request). The runner's
command is dispatched before the rest of the CLI is imported (:mod:`agentflows.cli.entry`),
and a pod's kubeconfig is read without the ``kubernetes`` package; litellm, mcp, kopf,
jsonschema and the CLI's other commands are imported only where they are used, and the optional
parts of httpx and httpcore (rich, pygments, h2) not at all. The agent loop and the session
modules wait for an agent node (an ``llm`` node's request needs neither; issue 25).

Besides the modules imported by the command, a real ``agentflows runner`` process runs a
one-``llm``-node FlowRun against a fake API server and the scripted model server, and its
modules are recorded at the moment it connects to the model server: its first model request
(the ``socket.connect`` audit event, which Python raises before any connection). Only the
libraries of :data:`LIBRARIES_BEFORE_THE_FIRST_REQUEST` may be loaded then.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.parse
from pathlib import Path

from agentflows.api import runner as runner_api
from agentflows.runner import main as runner_main
from tests.support import loaded_modules
from tests.support.fake_flowrun_api import FakeFlowRunApi
from tests.support.fixtures import model_server  # noqa: F401  (fixture)
from tests.support.model_server import Reply, ScriptedModelServer

#: Modules a runner with an OpenAI-compatible llm node must not import before its first node.
NOT_BEFORE_THE_FIRST_NODE = (
    "agentflows.agents.handoff",
    "agentflows.agents.sessions",
    "agentflows.agents.spec_tools",
    "agentflows.agents.turn",
    "agentflows.agentspec",
    "agentflows.api.agentsession",
    # the YAML reader: a runner reads JSON (in-cluster credentials or a JSON kubeconfig, the
    # snapshot, the FlowRun); only a YAML kubeconfig file loads it (kube/kubeconfig.py)
    "agentflows.api.documents",
    "agentflows.api.kubeyaml",
    "yaml",
    "agentflows.cli.main",
    "agentflows.cli.local",
    "agentflows.controller",
    "h2",
    "jsonschema",
    "kopf",
    "kubernetes",
    "litellm",
    "mcp",
    "opentelemetry",  # only when OTEL_EXPORTER_OTLP_ENDPOINT is set
    "orjson",
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
    # JSON: like a pod's in-cluster credentials, read without the YAML reader
    path.write_text(json.dumps(config))
    done = subprocess.run(
        [sys.executable, "-c", STARTS.format(kubeconfig=str(path))],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "agentflows runner" in done.stdout.splitlines()[0]
    loaded = json.loads(done.stdout.splitlines()[-1])
    assert loaded_modules.loaded_of(loaded, NOT_BEFORE_THE_FIRST_NODE) == []


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


#: The only third-party packages a runner may have loaded when it makes its first model
#: request, and why. Any other one fails the test: add it here only with its reason.
LIBRARIES_BEFORE_THE_FIRST_REQUEST = {
    "click": "the command",
    "pydantic": "the API models of the FlowRun, the snapshot's Flow and the node records",
    "pydantic_core": "pydantic",
    "annotated_types": "pydantic",
    "typing_extensions": "pydantic",
    "typing_inspection": "pydantic",
    "jq": "the Flow's expressions, compiled before the run",
    # the API client (kube/client.py)
    "aiohttp": "HTTP to the API server",
    "aiohappyeyeballs": "aiohttp",
    "aiosignal": "aiohttp",
    "attr": "aiohttp",
    "frozenlist": "aiohttp",
    "multidict": "aiohttp",
    "propcache": "aiohttp",
    "yarl": "aiohttp",
    "idna": "yarl",
    # the model client (agents/openai_compat.py)
    "httpx": "HTTP to the model",
    "httpcore": "httpx",
    "h11": "httpcore",
    "anyio": "httpx",
    "sniffio": "httpx",
    "certifi": "httpx's CA bundle",
    "zstandard": "httpx, which offers zstd responses when it is installed",
}

#: Runs the console script's main (argv[3:]) and writes sys.modules to argv[1] when the process
#: first connects to port argv[2], the model server's.
AT_FIRST_REQUEST = """
import json, sys

out, port = sys.argv[1], int(sys.argv[2])
del sys.argv[1:3]
seen = False


def at_first_model_request(event, args):
    global seen
    if event != "socket.connect" or seen:
        return
    address = args[1]
    if isinstance(address, tuple) and len(address) >= 2 and address[1] == port:
        seen = True
        with open(out, "w") as f:
            json.dump(sorted(m for m, v in sys.modules.items() if v is not None), f)


sys.addaudithook(at_first_model_request)
sys.argv[0] = "agentflows"
from agentflows.cli import entry

entry.main()
"""


async def test_the_runner_s_first_model_request_comes_with_only_the_libraries_it_needs(
    tmp_path: Path,
    model_server: ScriptedModelServer,  # noqa: F811
) -> None:
    model_server.script(Reply.text("hi"))
    model = {"name": "openai/scripted-model", "apiBase": model_server.url, "retries": 0}
    prepared = {"attempt": 3, "pod": "r-3", "phase": "Pending", "startTime": "2026-01-01T00:00:00Z"}
    api = FakeFlowRunApi("team", "r", status=prepared)
    api.snapshot({"nodes": [{"id": "ask", "llm": {"model": model, "prompt": "Say hi"}}]})
    out = tmp_path / "modules.json"
    async with api.client() as client:
        config = {
            "clusters": [{"name": "c", "cluster": {"server": client.config.server}}],
            "users": [{"name": "pod", "user": {"token": "t"}}],
            "contexts": [{"name": "pod", "context": {"cluster": "c", "user": "pod"}}],
            "current-context": "pod",
        }
        (tmp_path / "kubeconfig").write_text(json.dumps(config))
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env |= {
            "KUBECONFIG": str(tmp_path / "kubeconfig"),
            runner_main.ATTEMPT_ENV: "3",
            runner_api.CONFIGMAPS_ROOT_ENV: str(api.mounted.root),
        }
        port = str(urllib.parse.urlsplit(model_server.url).port)
        args = ["runner", "--namespace", "team", "--flowrun", "r"]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", AT_FIRST_REQUEST, str(out), port, *args,
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        _, stderr = await proc.communicate()
    assert proc.returncode == 0, stderr.decode()
    assert len(model_server.requests) == 1
    modules = set(json.loads(out.read_text()))
    assert "agentflows.runner.main" in modules  # the real command made the request
    assert loaded_modules.third_party(modules) - set(LIBRARIES_BEFORE_THE_FIRST_REQUEST) == set()
    assert loaded_modules.loaded_of(modules, NOT_BEFORE_THE_FIRST_NODE) == []

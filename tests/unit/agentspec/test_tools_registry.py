"""ServerTools implemented outside the document: a ``--tools`` module, the Python API's registry,
and the mock of ``--dry-run`` (issue 22, section 1).

The seed document ``tests/data/agentspec_tools/research_flow.yaml`` has a ``web_search``
ServerTool with no code, as documents written for other runtimes have.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from agentflows.agentspec import conversation, implementations
from tests.support.model_server import Reply, ScriptedModelServer
from tests.unit.agentspec.conftest import DOCUMENT_MODEL_URL, invoke, output_of

TOOLS_DATA = Path(__file__).parents[2] / "data" / "agentspec_tools"
SEED = TOOLS_DATA / "research_flow.yaml"
MODULE = TOOLS_DATA / "research_tools.py"
HITS = ["kopf: first hit", "kopf: second hit"]


def served_seed(tmp_path: Path, server: ScriptedModelServer) -> Path:
    path = tmp_path / "research_flow.yaml"
    path.write_text(SEED.read_text().replace(DOCUMENT_MODEL_URL, server.url))
    return path


def load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("user_tools", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_seed_research_flow_runs_with_dry_run_unchanged(tmp_path: Path) -> None:
    state = ("--state-dir", str(tmp_path))
    code, out, err = invoke("run", str(SEED), "--dry-run", *state, "--input", "topic=kopf")
    assert code == 0, err
    sources = output_of(out)["sources"]
    assert sources == {"tool": "search", "args": {"query": "kopf"}, "mock": True}


def test_the_seed_research_flow_runs_its_web_search_from_a_tools_module(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    spec = served_seed(tmp_path, model_server)
    model_server.script(Reply.text("Two hits about kopf."))
    state = ("--state-dir", str(tmp_path / "runs"))
    code, out, err = invoke(
        "run", str(spec), "--tools", str(MODULE), *state, "--input", "topic=kopf"
    )
    assert code == 0, err
    assert output_of(out) == {"summary": "Two hits about kopf.", "sources": HITS}
    assert json.dumps(HITS) in model_server.requests[0].messages[-1]["content"]


def test_validate_refuses_a_server_tool_without_implementation_unless_tools_gives_one() -> None:
    code, out, _err = invoke("validate", str(SEED))
    assert code == 2
    assert (
        "nodes[1].tool.metadata.agentflows.python: ServerTool 'web_search' has no "
        "implementation: give a function web_search in a --tools module, or set this to a "
        "Python script"
    ) in out
    code, out, _err = invoke("validate", str(SEED), "--tools", str(MODULE))
    assert code == 0, out


def test_a_tools_module_without_the_tool_s_function_leaves_it_unimplemented(
    tmp_path: Path,
) -> None:
    other = tmp_path / "other.py"
    other.write_text("def fetch(url):\n    return url\n\ndef _web_search(query):\n    return 1\n")
    code, out, _err = invoke("validate", str(SEED), "--tools", str(other))
    assert code == 2
    assert "ServerTool 'web_search' has no implementation" in out


def test_a_tools_module_that_is_not_python_is_refused_with_its_path(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def web_search(:\n")
    code, _out, err = invoke("run", str(SEED), "--tools", str(bad), "--input", "topic=x")
    assert code == 2
    assert f"--tools {bad}: not a readable Python module" in err


def test_the_python_api_takes_a_registry_of_functions_sync_or_async(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    module_path = tmp_path / "mine.py"
    module_path.write_text("def search_sync(query):\n    return {'results': [query.upper()]}\n")
    module = load_module(module_path)
    text = served_seed(tmp_path, model_server).read_text()
    model_server.script(Reply.text("One hit."))
    conv = conversation.Conversation.load(
        text, inputs={"topic": "kopf"}, tools={"web_search": module.search_sync}
    )
    status = conv.execute_sync()
    assert status.kind == conversation.StatusKind.FINISHED, status.message
    assert status.outputs == {"summary": "One hit.", "sources": ["KOPF"]}

    model_server.script(Reply.text("Two hits."))
    seed_module = load_module(MODULE)
    conv = conversation.Conversation.load(
        text, inputs={"topic": "kopf"}, tools={"web_search": seed_module.web_search}
    )
    status = conv.execute_sync()
    assert status.kind == conversation.StatusKind.FINISHED, status.message
    assert status.outputs == {"summary": "Two hits.", "sources": HITS}


def test_the_python_api_refuses_a_lambda_as_a_tool() -> None:
    with pytest.raises(
        implementations.ModuleError,
        match=r"tools\['web_search'\]: .* is not a function defined at the top level",
    ):
        conversation.Conversation.load(SEED.read_text(), tools={"web_search": lambda query: query})

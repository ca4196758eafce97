"""Reference files (``files``) put before an agent's conversation, as the model receives them.

The model is the scripted server on loopback; URLs are served by the loopback endpoint, which
the http guard allows because the URL names its address literally (as http-tool tests do).
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agentflows.agents import files, host
from agentflows.api import agent as agent_api
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.cli import main as cli
from agentflows.controller import pods
from agentflows.engine import capabilities, graph, run, store
from tests.support.endpoint import LoopbackEndpoint
from tests.support.model_server import Reply, ScriptedModelServer

#: A 1x1 PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


def spec_with(
    server: ScriptedModelServer, files_: list[dict[str, Any]], **model: Any
) -> agent_api.AgentSpec:
    return agent_api.AgentSpec.model_validate(
        {
            "model": server.model_spec(**model).to_wire(),
            "systemPrompt": "Answer from the files.",
            "files": files_,
        }
    )


async def turn(
    server: ScriptedModelServer,
    spec: agent_api.AgentSpec,
    ctx: capabilities.NodeContext,
    root: Path | None = None,
    node_files: list[agent_api.ReferenceFile] | None = None,
) -> capabilities.NodeResult:
    caps = host.LiveCapabilities(env=server.env, file_access=files.FileAccess(root=root))
    task = capabilities.AgentTask("reader", spec, "What do they say?", files=node_files or [])
    result = await caps.run_agent(task, ctx)
    assert isinstance(result, capabilities.NodeResult)
    return result


async def test_a_local_file_is_rendered_into_the_context_with_its_name_and_digest(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext, tmp_path: Path
) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "policy.md").write_text("Refunds within 30 days.")
    (tmp_path / "extra.txt").write_text("Shipping is free.")
    model_server.script(Reply.text("30 days"))
    spec = spec_with(model_server, [{"path": "docs/policy.md"}])
    node_file = agent_api.ReferenceFile(path="extra.txt", name="shipping")
    result = await turn(model_server, spec, ctx, tmp_path, [node_file])

    assert model_server.requests[0].messages == [
        {"role": "system", "content": "Answer from the files."},
        {
            "role": "user",
            "content": '<file name="policy.md">\nRefunds within 30 days.\n</file>\n\n'
            '<file name="shipping">\nShipping is free.\n</file>\n\nWhat do they say?',
        },
    ]
    assert result.detail["files"] == [
        {
            "name": "policy.md",
            "source": "path docs/policy.md",
            "contentType": "text/markdown",
            "size": 23,
            "sha256": hashlib.sha256(b"Refunds within 30 days.").hexdigest(),
        },
        {
            "name": "shipping",
            "source": "path extra.txt",
            "contentType": "text/plain",
            "size": 17,
            "sha256": hashlib.sha256(b"Shipping is free.").hexdigest(),
        },
    ]


def test_a_path_written_to_leave_its_root_is_refused_at_validation(tmp_path: Path) -> None:
    for path in ("../secret.txt", "docs/../../secret.txt", "/etc/passwd"):
        (tmp_path / "agent.yaml").write_text(
            "apiVersion: agentflows.io/v1alpha1\nkind: Agent\nmetadata: {name: reader}\n"
            f"spec: {{model: {{name: openai/gpt-4o}}, files: [{{path: {path!r}}}]}}\n"
        )
        result = CliRunner().invoke(cli.main, ["validate", str(tmp_path / "agent.yaml")])
        assert result.exit_code == 2
        assert (
            f"spec.files[0]: path {path!r} must be relative to the files root and stay inside "
            "it (no leading / and no .. out of it)"
        ) in result.output


async def test_a_link_leading_out_of_the_root_is_refused_before_any_model_call(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext, tmp_path: Path
) -> None:
    (tmp_path / "secret.txt").write_text("not yours")
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "link.txt").symlink_to(tmp_path / "secret.txt")
    spec = spec_with(model_server, [{"path": "link.txt"}])
    with pytest.raises(files.FileError) as refused:
        await turn(model_server, spec, ctx, tmp_path / "flows")
    assert str(refused.value) == (
        f"files[0].path: 'link.txt' leads outside {tmp_path / 'flows'}; "
        "give a path inside that directory"
    )
    assert model_server.requests == []


async def test_a_url_file_is_fetched_through_the_http_guard(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext, endpoint: LoopbackEndpoint
) -> None:
    model_server.script(Reply.text("plain"))
    spec = spec_with(model_server, [{"url": f"{endpoint.url}/text"}])
    result = await turn(model_server, spec, ctx)

    assert model_server.requests[0].messages[1]["content"] == (
        '<file name="text">\nplain words\n</file>\n\nWhat do they say?'
    )
    assert result.detail["files"][0]["source"] == f"url {endpoint.url}/text"
    assert endpoint.requests[0]["method"] == "GET"


async def test_a_url_whose_host_is_not_allowed_is_refused(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext, endpoint: LoopbackEndpoint
) -> None:
    spec = spec_with(
        model_server, [{"url": f"{endpoint.url}/text", "allowHosts": ["docs.example.com"]}]
    )
    with pytest.raises(files.FileError, match=r"host '127\.0\.0\.1' is not allowed"):
        await turn(model_server, spec, ctx)
    assert endpoint.requests == [] and model_server.requests == []


async def test_an_image_is_refused_for_a_text_only_model_and_attached_for_a_vision_one(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext, tmp_path: Path
) -> None:
    (tmp_path / "chart.png").write_bytes(PNG)
    text_only = spec_with(model_server, [{"path": "chart.png"}], name="openai/gpt-3.5-turbo")
    with pytest.raises(files.FileError) as refused:
        await turn(model_server, text_only, ctx, tmp_path)
    assert str(refused.value) == (
        "file 'chart.png' (path chart.png) is image/png, but model openai/gpt-3.5-turbo does "
        "not accept images (litellm's model table); use a model that does, or attach text"
    )
    assert model_server.requests == []

    model_server.script(Reply.text("a chart"))
    vision = spec_with(model_server, [{"path": "chart.png"}], name="openai/gpt-4o")
    await turn(model_server, vision, ctx, tmp_path)
    [_, user] = model_server.requests[0].messages
    assert user["content"] == [
        {
            "type": "image_url",
            "image_url": {"url": "data:image/png;base64," + base64.b64encode(PNG).decode()},
        },
        {"type": "text", "text": "What do they say?"},
    ]


async def test_files_over_their_own_limit_or_the_total_are_refused_with_the_sizes(
    model_server: ScriptedModelServer,
    ctx: capabilities.NodeContext,
    tmp_path: Path,
    endpoint: LoopbackEndpoint,
) -> None:
    (tmp_path / "big.txt").write_bytes(b"x" * 2000)
    spec = spec_with(model_server, [{"path": "big.txt", "maxBytes": 1000}])
    with pytest.raises(files.FileError, match=r"files\[0\] \(path big.txt\): 2000 bytes, over "):
        await turn(model_server, spec, ctx, tmp_path)
    spec = spec_with(model_server, [{"url": f"{endpoint.url}/big", "maxBytes": 1000}])
    with pytest.raises(files.FileError, match="larger than maxResponseBytes=1000"):
        await turn(model_server, spec, ctx)
    chunk = agent_api.FILE_MAX_BYTES_LIMIT
    for n in range(3):
        (tmp_path / f"part{n}.txt").write_bytes(b"y" * chunk)
    spec = spec_with(model_server, [{"path": f"part{n}.txt", "maxBytes": chunk} for n in range(3)])
    with pytest.raises(files.FileError) as over:
        await turn(model_server, spec, ctx, tmp_path)
    assert str(over.value) == (
        f"files[2] (path part2.txt): the files come to {3 * chunk} bytes, over the "
        f"{files.MAX_TOTAL_BYTES} bytes all files of one agent may hold together"
    )
    assert model_server.requests == []


async def test_a_secret_file_comes_from_the_injected_environment_and_stays_out_of_records(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext
) -> None:
    model_server.script(Reply.text("ok"))
    spec = spec_with(model_server, [{"secretKeyRef": {"name": "kb", "key": "terms.txt"}}])
    env = {**model_server.env, "AGENTFLOWS_SECRET_KB_TERMS_TXT": "clause 7 applies"}
    caps = host.LiveCapabilities(env=env)
    result = await caps.run_agent(capabilities.AgentTask("reader", spec, "Which clause?"), ctx)

    assert isinstance(result, capabilities.NodeResult)
    assert "clause 7 applies" in model_server.requests[0].messages[1]["content"]
    assert "clause 7 applies" not in str(result.detail)
    assert result.detail["files"][0]["source"] == "secret kb/terms.txt"


def test_agentflows_run_reads_a_path_relative_to_the_flow_file(
    model_server: ScriptedModelServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "faq.txt").write_text("Open 9 to 5.")
    model = model_server.model_spec().to_wire()
    (project / "flow.yaml").write_text(
        f"""
apiVersion: agentflows.io/v1alpha1
kind: Agent
metadata: {{name: reader}}
spec:
  model: {{name: {model["name"]}, apiBase: "{model["apiBase"]}", apiKey: {{secretKeyRef:
    {{name: scripted-model, key: api-key}}}}}}
---
apiVersion: agentflows.io/v1alpha1
kind: Flow
metadata: {{name: ask}}
spec:
  nodes:
    - id: ask
      agent: {{name: reader, prompt: "When?", files: [{{path: faq.txt}}]}}
"""
    )
    for key, value in model_server.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    model_server.script(Reply.text("9 to 5"))
    result = CliRunner().invoke(
        cli.main,
        ["run", str(project / "flow.yaml"), "--state-dir", str(tmp_path / "runs"), "-q"],
    )

    assert result.exit_code == 0, result.output
    assert model_server.requests[0].messages[0]["content"] == (
        '<file name="faq.txt">\nOpen 9 to 5.\n</file>\n\nWhen?'
    )


def test_the_runner_pod_gets_the_secrets_of_agent_and_node_files_as_env() -> None:
    agent = agent_api.AgentSpec.model_validate(
        {
            "model": {"name": "openai/gpt-4o"},
            "files": [{"secretKeyRef": {"name": "kb", "key": "terms.txt"}}],
        }
    )
    flow = flow_api.FlowSpec.model_validate(
        {
            "nodes": [
                {
                    "id": "ask",
                    "agent": {
                        "name": "reader",
                        "prompt": "hi",
                        "files": [{"secretKeyRef": {"name": "kb", "key": "extra"}}],
                    },
                }
            ]
        }
    )
    assert pods.secret_refs({"f": flow}, {"reader": agent}) == {"kb": {"extra", "terms.txt"}}


async def test_a_url_file_answering_503_is_retried_by_the_node_retry_policy(
    model_server: ScriptedModelServer, endpoint: LoopbackEndpoint
) -> None:
    resolver = graph.StaticResolver(
        {"reader": spec_with(model_server, [{"url": f"{endpoint.url}/fail"}])}
    )
    flow = flow_api.FlowSpec.model_validate(
        {
            "nodeRetry": {"maxAttempts": 2, "backoffSeconds": 0},
            "nodes": [{"id": "ask", "agent": {"name": "reader", "prompt": "hi"}}],
        }
    )
    memory = store.MemoryStore()
    outcome = await run.run_flow(
        graph.compile_flow(flow, resolver),
        run_name="r",
        input_value=None,
        store_=memory,
        caps=host.LiveCapabilities(resolver, env=model_server.env),
        resolver=resolver,
    )

    assert outcome.phase == flowrun_api.RunPhase.FAILED
    record = (await memory.load()).nodes["ask"]
    assert record.attempts == 2
    assert "files[0].url: HTTP 503 from 127.0.0.1: backend down" in (record.error or "")
    assert [r["path"] for r in endpoint.requests] == ["/fail", "/fail"]
    assert model_server.requests == []


async def test_a_pdf_goes_as_a_file_part_to_a_model_that_reads_pdfs(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext, tmp_path: Path
) -> None:
    pdf = b"%PDF-1.4\n1 0 obj << >> endobj\ntrailer << >>\n%%EOF\n"
    (tmp_path / "terms.pdf").write_bytes(pdf)
    model_server.script(Reply.text("read"))
    spec = spec_with(model_server, [{"path": "terms.pdf"}], name="openai/gpt-4o")
    result = await turn(model_server, spec, ctx, tmp_path)

    [_, user] = model_server.requests[0].messages
    assert user["content"][0] == {
        "type": "file",
        "file": {
            "filename": "terms.pdf",
            "file_data": "data:application/pdf;base64," + base64.b64encode(pdf).decode(),
        },
    }
    assert result.detail["files"][0]["contentType"] == "application/pdf"


@pytest.mark.parametrize("kind", ["fifo", "directory"])
async def test_a_path_that_is_not_a_regular_file_is_refused_without_waiting_on_it(
    model_server: ScriptedModelServer, ctx: capabilities.NodeContext, tmp_path: Path, kind: str
) -> None:
    # A FIFO with no writer: opening it for reading the usual way waits for one forever.
    if kind == "fifo":
        os.mkfifo(tmp_path / "notes.txt")
    else:
        (tmp_path / "notes.txt").mkdir()
    spec = spec_with(model_server, [{"path": "notes.txt"}])
    with pytest.raises(files.FileError) as refused:
        await turn(model_server, spec, ctx, tmp_path)
    assert str(refused.value) == (
        "files[0].path: 'notes.txt' is not a regular file; only regular files are read"
    )
    assert model_server.requests == []

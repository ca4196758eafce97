"""Traces of a run: one trace over its pauses, node/agent/model/tool spans with GenAI attributes.

The tracer is the real OpenTelemetry SDK with its own in-memory exporter; models are the
scripted server on loopback; the tool is a real Python tool subprocess.
"""

from __future__ import annotations

import http.server
import itertools
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentflows import tracing
from agentflows.agents import host
from agentflows.api import agent as agent_api
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.engine import graph, run, store
from tests.support.fixtures import model_server  # noqa: F401  (fixture)
from tests.support.http_serving import ServedHTTP
from tests.support.model_server import API_KEY, Reply, ScriptedModelServer, ToolCall

UID = "6f1c2d3e-4b5a-4c7d-8e9f-0a1b2c3d4e5f"
ECHO = "import json, sys\nprint(json.dumps({'got': json.load(sys.stdin)}))"
#: The model's API key (a Secret's value): it must never reach a span, even if a prompt holds it.
SECRET = API_KEY


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    tracing.configure("agentflows-test", {}, exporter=memory)
    try:
        yield memory
    finally:
        tracing.shutdown()


@pytest.fixture
def exporter_with_content() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    environ = {tracing.CAPTURE_CONTENT_ENV: "true"}
    tracing.configure("agentflows-test", environ, exporter=memory)
    try:
        yield memory
    finally:
        tracing.shutdown()


def flow_and_resolver(
    server: ScriptedModelServer,
) -> tuple[flow_api.FlowSpec, graph.StaticResolver]:
    agent = agent_api.AgentSpec(
        model=server.model_spec(),
        system_prompt=f"The key is {SECRET}; never say it.",
        tools=[agent_api.Tool(name="look", python=agent_api.PythonTool(script=ECHO))],
    )
    flow = flow_api.FlowSpec.model_validate(
        {
            "nodes": [
                {"id": "plan", "llm": {"model": server.model_spec().model_dump(by_alias=True,
                                                                              exclude_none=True),
                                       "prompt": "Plan the cleanup"}},
                {"id": "review", "approval": {"message": "Clean up?"}},
                {"id": "clean", "agent": {"name": "janitor", "prompt": "Clean /tmp"}},
            ],
        }
    )  # fmt: skip
    return flow, graph.StaticResolver({"janitor": agent}, {"f": flow})


async def run_paused_then_approved(server: ScriptedModelServer) -> None:
    """Two executions of one run, as two pods would: to the approval, then to the end."""
    flow, resolver = flow_and_resolver(server)
    checkpoints = store.MemoryStore()
    server.script(Reply.text("1. look"))
    phases = []
    for _ in range(2):
        with tracing.run_context(UID, None):
            outcome = await run.run_flow(
                graph.compile_flow(flow, resolver),
                run_name="cleanup",
                input_value=None,
                store_=checkpoints,
                caps=host.LiveCapabilities(resolver, server.env),
                resolver=resolver,
            )
        phases.append(outcome.phase)
        if outcome.phase == flowrun_api.RunPhase.WAITING:
            await checkpoints.decide("review", decision="approve", decided_by="alice")
            server.script(
                Reply.calls(ToolCall("look", {"path": "/tmp"}, id="c1")), Reply.text("Clean.")
            )
    assert phases == [flowrun_api.RunPhase.WAITING, flowrun_api.RunPhase.SUCCEEDED]


def finished(memory: InMemorySpanExporter) -> list[ReadableSpan]:
    tracing.shutdown()  # exports what the batch processor still holds
    return list(memory.get_finished_spans())


def named(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = named(spans, name)
    assert len(found) == 1, f"{name}: {[s.name for s in spans]}"
    return found[0]


async def test_a_paused_and_resumed_run_is_one_trace_with_a_run_span_per_execution(
    model_server: ScriptedModelServer,  # noqa: F811
    exporter: InMemorySpanExporter,
) -> None:
    await run_paused_then_approved(model_server)
    spans = finished(exporter)
    assert {span.context.trace_id for span in spans} == {uuid.UUID(UID).int}
    runs = named(spans, "run cleanup")
    assert len(runs) == 2
    assert {parent_of(span) for span in runs} == {tracing.run_span_id(UID)}
    assert [span.attributes["agentflows.run.phase"] for span in runs] == ["Waiting", "Succeeded"]
    reviews = named(spans, "node review")
    assert [span.attributes["agentflows.node.phase"] for span in reviews] == [
        "Waiting",
        "Succeeded",
    ]
    assert [parent_of(span) for span in reviews] == [span.context.span_id for span in runs]
    assert parent_of(one(spans, "node plan")) == runs[0].context.span_id
    assert parent_of(one(spans, "node clean")) == runs[1].context.span_id


async def test_model_agent_and_tool_spans_nest_and_carry_genai_attributes(
    model_server: ScriptedModelServer,  # noqa: F811
    exporter: InMemorySpanExporter,
) -> None:
    await run_paused_then_approved(model_server)
    spans = finished(exporter)
    model = model_server.model_spec().name
    plan_chat, *agent_chats = named(spans, f"chat {model}")
    assert parent_of(plan_chat) == one(spans, "node plan").context.span_id
    assert plan_chat.attributes["gen_ai.operation.name"] == "chat"
    assert plan_chat.attributes["gen_ai.request.model"] == model
    assert plan_chat.attributes["gen_ai.response.model"]
    assert plan_chat.attributes["gen_ai.usage.input_tokens"] > 0
    assert plan_chat.attributes["gen_ai.usage.output_tokens"] > 0
    turn = one(spans, "invoke_agent janitor")
    assert turn.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert parent_of(turn) == one(spans, "node clean").context.span_id
    assert len(agent_chats) == 2
    assert {parent_of(span) for span in agent_chats} == {turn.context.span_id}
    tool = one(spans, "execute_tool look")
    assert parent_of(tool) == turn.context.span_id
    assert tool.attributes["gen_ai.tool.name"] == "look"
    assert tool.attributes["gen_ai.tool.call.id"] == "c1"
    content = [k for span in spans for k in span.attributes if "messages" in k or "call.a" in k]
    assert content == [], "content is off unless asked for"


async def test_captured_content_is_on_the_spans_with_secrets_redacted(
    model_server: ScriptedModelServer,  # noqa: F811
    exporter_with_content: InMemorySpanExporter,
) -> None:
    await run_paused_then_approved(model_server)
    spans = finished(exporter_with_content)
    plan_chat = named(spans, f"chat {model_server.model_spec().name}")[0]
    assert "Plan the cleanup" in str(plan_chat.attributes["gen_ai.input.messages"])
    assert "1. look" in str(plan_chat.attributes["gen_ai.output.messages"])
    tool = one(spans, "execute_tool look")
    assert '"/tmp"' in str(tool.attributes["gen_ai.tool.call.arguments"])
    attributes = str([dict(span.attributes or {}) for span in spans])
    assert SECRET not in attributes
    assert "The key is " in attributes, "the system prompt is there, redacted"


def test_a_webhook_callers_traceparent_makes_the_run_span_its_child(
    exporter: InMemorySpanExporter,
) -> None:
    caller_trace, caller_span = 0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7
    traceparent = f"00-{caller_trace:032x}-{caller_span:016x}-01"
    tracing.record_run(UID, traceparent, "flowrun cleanup", {}, 1_000, 2_000)
    tracing.record_run(str(uuid.UUID(int=7)), None, "flowrun other", {}, 1_000, 2_000)
    spans = finished(exporter)
    called = one(spans, "flowrun cleanup")
    assert called.context.trace_id == caller_trace
    assert called.context.span_id == tracing.run_span_id(UID)
    assert parent_of(called) == caller_span
    root = one(spans, "flowrun other")
    assert root.context.trace_id == 7 and root.parent is None


def test_a_malformed_traceparent_is_ignored_and_the_run_keeps_its_own_trace() -> None:
    assert tracing.parse_traceparent("00-zz-11-01") is None
    assert tracing.parse_traceparent(f"00-{0:032x}-{1:016x}-01") is None
    assert tracing.run_trace_id(UID, "garbage") == uuid.UUID(UID).int


class OtlpReceiver(ServedHTTP):
    """An OTLP/HTTP endpoint on loopback that decodes and keeps what it is sent."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, Any]] = []  # (service name, protobuf Span)
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                for resource_spans in request.resource_spans:
                    service = next(
                        a.value.string_value
                        for a in resource_spans.resource.attributes
                        if a.key == "service.name"
                    )
                    for scope in resource_spans.scope_spans:
                        receiver.spans += [(service, span) for span in scope.spans]
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        super().__init__(Handler)

    @property
    def url(self) -> str:
        return self.origin


def local_flow(tmp_path: Path, server: ScriptedModelServer) -> Path:
    model = server.model_spec()
    path = tmp_path / "flow.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            apiVersion: agentflows.io/v1alpha1
            kind: Flow
            metadata: {{name: hi}}
            spec:
              nodes:
                - id: ask
                  llm:
                    model: {{name: {model.name}, apiBase: "{model.api_base}"}}
                    prompt: Say hi
            """
        )
    )
    return path


def test_a_local_run_with_an_otlp_endpoint_exports_its_tree_over_otlp_http(
    model_server: ScriptedModelServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    receiver = OtlpReceiver().start()
    model_server.script(Reply.text("hi"))
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-m", "agentflows.cli.main", "run", str(local_flow(tmp_path, model_server)),
         "--state-dir", str(tmp_path / "state"), "--name", "hi-1", "-q"],
        env={**environ, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    receiver.stop()
    assert done.returncode == 0, done.stderr
    by_name = {span.name: span for _, span in receiver.spans}
    assert set(by_name) == {"flowrun hi-1", "run hi-1", "node ask", "chat openai/scripted-model"}
    assert {service for service, _ in receiver.spans} == {"agentflows-cli"}
    uid = tracing.local_run_uid(tmp_path / "state" / "hi-1.json")
    assert {span.trace_id.hex() for _, span in receiver.spans} == {uuid.UUID(uid).hex}
    root = by_name["flowrun hi-1"]
    assert root.parent_span_id == b"" and root.span_id.hex() == f"{tracing.run_span_id(uid):016x}"
    chain = ["flowrun hi-1", "run hi-1", "node ask", "chat openai/scripted-model"]
    for parent_name, child_name in itertools.pairwise(chain):
        assert by_name[child_name].parent_span_id == by_name[parent_name].span_id


def test_with_tracing_off_a_local_run_imports_nothing_of_opentelemetry(
    model_server: ScriptedModelServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    flow_file = local_flow(tmp_path, model_server)
    model_server.script(Reply.text("hi"))
    probe = textwrap.dedent(
        """\
        import sys
        from agentflows.cli import entry
        try:
            entry.main()
        except SystemExit as exit:
            loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
            print("exit", exit.code, "loaded", loaded, file=sys.stderr)
        """
    )
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", probe, "run", str(flow_file), "--state-dir",
         str(tmp_path / "state"), "-q"],
        env={**environ, **model_server.env, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.stderr.strip().splitlines()[-1] == "exit 0 loaded []", done.stderr


def test_runner_pods_get_the_operators_otel_variables_but_their_own_service_name() -> None:
    environ = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
        "OTEL_SERVICE_NAME": "agentflows-operator",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod",
        "HOME": "/root",
    }
    assert tracing.pod_env(environ) == [
        {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://collector:4318"},
        {"name": "OTEL_RESOURCE_ATTRIBUTES", "value": "deployment.environment=prod"},
    ]
    assert tracing.pod_env({"OTEL_RESOURCE_ATTRIBUTES": "a=b"}) == [], "no endpoint: no tracing"
    disabled = {**environ, "OTEL_SDK_DISABLED": "true"}
    assert tracing.pod_env(disabled) == []

"""Attacks through jq expressions (issue 11, items 1 and 3): each must fail for the attacker.

A Flow author reads no Secret from the process environment, and no expression runs longer or
larger than its bound, in the runner, the CLI, the operator's trigger filters or the webhook
receiver's inputs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from agentflows.api import flow as flow_api
from agentflows.api.flowrun import RunPhase
from agentflows.engine import expressions, graph, jqsandbox, store
from agentflows.kube import client as kube
from agentflows.kube import kubeconfig
from agentflows.triggers import common, kubernetes

from ..engine.helpers import CountingHost, agents, flow_spec, run_once

#: The issue's reproducers r7 and r8: a 2 s run limit and a transform that never ends.
LOOPING_FLOWS = {
    "loop": "limits: {timeoutSeconds: 2}\nnodes: [{id: a, transform: '=def f: f; f'}]",
    "allocate": "limits: {timeoutSeconds: 2}\n"
    "nodes: [{id: a, transform: '=[range(1e9)] | length'}]",
}
SECRET = "sk-canary-7f3a"


def problems(text: str) -> list[str]:
    spec = flow_spec(text)
    return [str(p) for p in graph.validate(spec, graph.StaticResolver(agents("a")))]


# --- 1. Secrets through expressions -------------------------------------------------------------


def test_the_issue_payload_is_refused_at_validation_with_its_path() -> None:
    found = problems("""
nodes:
  - id: leak
    transform: "={k: $ENV.OPENAI_API_KEY, s: env.AGENTFLOWS_SECRET_LLM_KEYS_OPENAI}"
""")
    assert len(found) == 1
    assert found[0].startswith("spec.nodes[0].transform: ")
    assert "$ENV reads the process environment" in found[0]
    assert "expressions read only their scope" in found[0]


ESCAPES = [
    "env.HOME",
    "$ENV",
    "{$ENV}",
    "env | keys",
    '"\\(env.HOME)"',
    '@base64 "\\($ENV | tojson)"',
    "[.[] | env]",
    ".a # a comment\n | env",
    "input",
    "[inputs]",
    "input_filename",
    "input_line_number",
    "$__prog_args",
    "get_search_list",
    "get_prog_origin",
    "get_jq_origin",
    "modulemeta",
    'import "x" as x; .',
    'include "x"; .',
    "halt",
    '"x" | halt_error',
    "debug",
    "stderr",
    "localtime",
    'strflocaltime("%c")',
]


@pytest.mark.parametrize("program", ESCAPES)
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("transform", "={p}"),
        ("branch.value", "={p}"),
        ("tool.args", {"x": "={p}"}),
        ("agent.prompt", "say {{{{ {p} }}}}"),
    ],
)
def test_expressions_that_reach_outside_their_scope_are_refused_everywhere(
    program: str, field: str, value: Any
) -> None:
    rendered = json.loads(json.dumps(value).replace("{p}", json.dumps(program)[1:-1]))
    if isinstance(rendered, str):
        rendered = rendered.replace("{{{{", "{{").replace("}}}}", "}}")
    node: dict[str, Any] = {"id": "n"}
    if field == "branch.value":
        node["branch"] = {"value": rendered, "cases": {}, "default": "end"}
    elif field == "tool.args":
        node["tool"] = {"python": {"script": "print(1)"}, "args": rendered}
    elif field == "agent.prompt":
        node["agent"] = {"name": "a", "prompt": rendered}
    else:
        node["transform"] = rendered
    nodes = [node, {"id": "end", "transform": "=1"}]
    found = problems(yaml.safe_dump({"nodes": nodes}))
    jq_problems = [p for p in found if "not available" in p or "process" in p or "jq" in p]
    assert jq_problems, found
    assert jq_problems[0].startswith(f"spec.nodes[0].{field}")


@pytest.mark.parametrize(
    "program",
    [
        ".env",
        "{env: 1}",
        "{env}",
        '"env and $ENV"',
        ".a # env",
        ".a # a comment that jq continues \\\n | env",
        '.["env"]',
        "$__loc__.line",
    ],
)
def test_the_word_env_as_data_is_allowed(program: str) -> None:
    template = expressions.compile_expression(program)
    assert expressions.evaluate(template, expressions.Scope({"env": 1, "a": 2})) is not Ellipsis


def test_trigger_filters_and_inputs_cannot_read_the_environment() -> None:
    looping = flow_api.Trigger.model_validate(
        {"name": "t", "kubernetes": {"apiVersion": "v1", "kind": "Pod", "filter": "$ENV | length"}}
    )
    with pytest.raises(common.TriggerError, match=r"\$ENV reads the process environment"):
        common.check_expressions(looping)
    leaking = flow_api.Trigger.model_validate(
        {
            "name": "w",
            "webhook": {"secret": {"name": "s", "key": "k"}},
            "input": {"key": "={k: env}"},
        }
    )
    with pytest.raises(common.TriggerError, match="`env` is not available"):
        common.check_expressions(leaking)


def test_the_evaluator_process_sees_no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # Defence in depth: even a program the compile-time check missed sees an empty environment.
    monkeypatch.setenv("AGENTFLOWS_SECRET_CANARY", SECRET)
    jqsandbox._POOL.close()  # workers started from here on were started with the canary set
    values = jqsandbox.evaluate("$ENV", "null", 10.0)
    assert SECRET not in json.dumps(values)
    assert "AGENTFLOWS_SECRET_CANARY" not in values[0]


# --- 3. Expressions that never end -------------------------------------------------------------


def test_a_looping_expression_fails_at_its_bound_and_the_evaluator_recovers() -> None:
    template = expressions.compile_expression("def f: f; f")
    # 3 s, not 1: on a loaded machine starting the evaluator process alone can take a second
    scope = expressions.Scope({}, deadline=time.monotonic() + 3)
    with pytest.raises(expressions.ExpressionLimit, match="expression exceeded 3 s"):
        expressions.evaluate(template, scope)
    again = expressions.compile_expression("[limit(3; repeat(1))]")
    assert expressions.evaluate(again, expressions.Scope({})) == [1, 1, 1]


def test_an_expression_that_allocates_without_end_fails_on_its_memory_limit() -> None:
    # jq folds the constant as it compiles: the bound is hit there, in the worker
    scope = expressions.Scope({}, deadline=time.monotonic() + 30)
    with pytest.raises(expressions.ExpressionLimit, match=r"exceeded its memory limit \(512 MiB\)"):
        expressions.evaluate(expressions.compile_expression('"x" * 1e9 | length'), scope)


@pytest.mark.parametrize("flow", sorted(LOOPING_FLOWS))
async def test_the_reproducer_flows_fail_with_the_node_error(
    flow: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The run loop passes no deadline to expressions yet: the per-expression default applies.
    monkeypatch.setattr(expressions, "DEFAULT_TIMEOUT_SECONDS", 1.0)
    spec = flow_spec(LOOPING_FLOWS[flow])
    outcome = await run_once(spec, store.MemoryStore(), CountingHost())
    assert outcome.phase == RunPhase.FAILED
    assert outcome.message is not None and "exceeded" in outcome.message


def test_a_looping_trigger_input_fails_within_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "EXPRESSION_SECONDS", 0.5)
    trigger = flow_api.Trigger.model_validate(
        {"name": "w", "webhook": {"secret": {"name": "s", "key": "k"}}, "input": "=def f: f; f"}
    )
    flow = {"metadata": {"name": "f", "namespace": "team"}}
    with pytest.raises(common.TriggerError, match=r"trigger w input: .*exceeded 0\.5 s"):
        common.flowrun_body(flow, trigger, common.RunRequest(payload={}))


class FakeApiServer:
    """A loopback API server: ConfigMap discovery, list and one watch stream; FlowRun creates."""

    def __init__(self, events: list[dict[str, Any]], timeline: list[str]) -> None:
        self.events = events
        self.timeline = timeline
        self.created: list[dict[str, Any]] = []
        self.all_created = asyncio.Event()
        self.streamed = False
        self.release = asyncio.Event()
        self.app = web.Application()
        self.app.router.add_get("/api/v1", self.discovery)
        self.app.router.add_get("/api/v1/configmaps", self.configmaps)
        self.app.router.add_get("/api/v1/namespaces/{ns}/configmaps", self.configmaps)
        #: The paths of the list and watch requests, in order.
        self.paths: list[str] = []
        self.app.router.add_post("/apis/agentflows.io/v1alpha1/namespaces/{ns}/flowruns", self.run)

    async def discovery(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"resources": [{"name": "configmaps", "kind": "ConfigMap", "namespaced": True}]}
        )

    async def configmaps(self, request: web.Request) -> web.StreamResponse:
        self.paths.append(request.path)
        if request.query.get("watch") != "true":
            return web.json_response({"metadata": {"resourceVersion": "1"}, "items": []})
        response = web.StreamResponse()
        await response.prepare(request)
        if not self.streamed:
            self.streamed = True
            for event in self.events:
                await response.write(json.dumps(event).encode() + b"\n")
        await self.release.wait()  # later watches stay open, as the API server's do
        return response

    async def run(self, request: web.Request) -> web.Response:
        body = await request.json()
        body["metadata"]["name"] = f"run-{len(self.created)}"
        self.created.append(body)
        self.timeline.append(f"created {body['spec']['flow']}")
        if len(self.created) == len(self.events):
            self.all_created.set()
        return web.json_response(body, status=201)


def configmap_flow(name: str, uid: str, filter_: str) -> dict[str, Any]:
    trigger = {"name": "cm", "kubernetes": {"apiVersion": "v1", "kind": "ConfigMap"}}
    trigger["kubernetes"]["filter"] = filter_
    return {
        "metadata": {"name": name, "namespace": "team", "uid": uid, "generation": 1},
        "spec": {"nodes": [{"id": "a", "transform": "=1"}], "triggers": [trigger]},
    }


class Timeline(logging.Handler):
    def __init__(self, timeline: list[str]) -> None:
        super().__init__()
        self.timeline = timeline
        self.suspended = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "suspended" in record.getMessage():
            self.timeline.append("suspended")
            self.suspended.set()


async def test_a_looping_trigger_filter_delays_no_other_flow_and_never_blocks_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(common, "EXPRESSION_SECONDS", 1.0)
    timeline: list[str] = []
    events = [
        {
            "type": "ADDED",
            "object": {"metadata": {"name": f"cm-{i}", "namespace": "team", "uid": f"u{i}"}},
        }
        for i in range(5)
    ]
    fake = FakeApiServer(events, timeline)
    handler = Timeline(timeline)
    logging.getLogger(kubernetes.__name__).addHandler(handler)
    server = TestServer(fake.app)
    await server.start_server()
    api = kube.Client(kubeconfig.Config(server=str(server.make_url(""))), retry_seconds=0)
    manager = kubernetes.WatchManager(api)

    async def tick() -> None:
        while True:
            timeline.append("tick")
            await asyncio.sleep(0.01)

    ticker = asyncio.create_task(tick())
    try:
        await manager.sync(
            [
                configmap_flow("bad", "uid-bad", "def f: f; f"),
                configmap_flow(
                    "good", "uid-good", '.event.object.metadata.name | startswith("cm-")'
                ),
            ]
        )
        await asyncio.wait_for(fake.all_created.wait(), 60)
        await asyncio.wait_for(handler.suspended.wait(), 60)
    finally:
        ticker.cancel()
        fake.release.set()
        await manager.close()
        await api.close()
        await server.close()
        logging.getLogger(kubernetes.__name__).removeHandler(handler)

    assert [run["spec"]["flow"] for run in fake.created] == ["good"] * len(events)
    assert timeline.count("suspended") == 1  # one bound spent, not one per event
    first_run = timeline.index("created good")
    suspended = timeline.index("suspended")
    assert first_run < suspended  # the good Flow's run did not wait for the bad filter
    assert timeline[first_run:suspended].count("tick") >= 3  # the loop kept running meanwhile


async def test_looping_filters_holding_every_evaluator_lose_no_event_of_another_flow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # More looping filters than evaluators, considered before a good filter that needs an
    # evaluator too: the good filter waits its turn (the bad ones are suspended after one
    # bound each) instead of dropping the event, and each bad Flow's author is told once.
    monkeypatch.setattr(common, "EXPRESSION_SECONDS", 1.0)
    timeline: list[str] = []
    events = [
        {
            "type": "ADDED",
            "object": {"metadata": {"name": f"cm-{i}", "namespace": "team", "uid": f"u{i}"}},
        }
        for i in range(3)
    ]
    fake = FakeApiServer(events, timeline)
    server = TestServer(fake.app)
    await server.start_server()
    api = kube.Client(kubeconfig.Config(server=str(server.make_url(""))), retry_seconds=0)
    told: list[tuple[str, str, str]] = []

    async def on_suspended(flow: Any, trigger: str, message: str) -> None:
        told.append((flow["metadata"]["name"], trigger, message))

    manager = kubernetes.WatchManager(api, on_suspended=on_suspended)
    bad = [
        configmap_flow(f"bad-{i}", f"uid-bad-{i}", "def f: f; f")
        for i in range(jqsandbox.POOL_SIZE + 1)
    ]
    good = configmap_flow("good", "uid-good", '.event.object.metadata.name | test("^cm-")')
    try:
        await manager.sync([*bad, good])
        await asyncio.wait_for(fake.all_created.wait(), 120)
    finally:
        fake.release.set()
        await manager.close()
        await api.close()
        await server.close()

    assert [run["spec"]["flow"] for run in fake.created] == ["good"] * len(events)
    assert sorted(name for name, _, _ in told) == [flow["metadata"]["name"] for flow in bad]
    assert all(
        trigger == "cm" and "suspended until the Flow changes" in message
        for _, trigger, message in told
    )

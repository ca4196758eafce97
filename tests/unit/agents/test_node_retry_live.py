"""Node retries against real endpoints: which model and http failures a node tries again."""

from __future__ import annotations

from typing import Any

from agentflows.agents import host
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.engine import graph, run, store
from tests.support.model_server import Reply, ScriptedModelServer

RETRY = {"maxAttempts": 3, "backoffSeconds": 0}


async def _run(node: dict[str, Any], env: dict[str, str]) -> tuple[store.Outcome, Any]:
    spec = flow_api.FlowSpec.model_validate({"nodes": [{"id": "n", "retry": RETRY, **node}]})
    resolver = graph.StaticResolver({})
    st = store.MemoryStore()
    outcome = await run.run_flow(
        graph.compile_flow(spec, resolver),
        run_name="r",
        input_value=None,
        store_=st,
        caps=host.LiveCapabilities(resolver, env=env),
        resolver=resolver,
    )
    return outcome, st.checkpoint.nodes["n"]


async def test_a_model_rate_limit_is_retried_by_the_node_policy(
    model_server: ScriptedModelServer,
) -> None:
    model_server.script(Reply.error(429, "slow down"), Reply.text("fine"))
    model = model_server.model_spec().model_dump(by_alias=True, exclude_none=True)
    outcome, record = await _run({"llm": {"model": model, "prompt": "hi"}}, model_server.env)
    assert outcome.phase == flowrun_api.RunPhase.SUCCEEDED and record.output["text"] == "fine"
    assert record.attempts == 2 and "HTTP 429" in record.attempt_errors[0]


async def test_a_model_bad_request_is_not_retried(model_server: ScriptedModelServer) -> None:
    model_server.script(Reply.error(400, "bad request"), Reply.text("never"))
    model = model_server.model_spec().model_dump(by_alias=True, exclude_none=True)
    outcome, record = await _run({"llm": {"model": model, "prompt": "hi"}}, model_server.env)
    assert outcome.phase == flowrun_api.RunPhase.FAILED and "HTTP 400" in (outcome.message or "")
    assert record.attempts == 1 and len(model_server.requests) == 1


async def test_an_http_tool_5xx_is_retried_and_a_404_is_not(endpoint: Any) -> None:
    failing, record = await _run({"tool": {"http": {"url": endpoint.url + "/fail"}}}, {})
    assert failing.phase == flowrun_api.RunPhase.FAILED and record.attempts == 3
    assert [p["path"] for p in endpoint.requests] == ["/fail"] * 3
    assert all("HTTP 503" in e for e in record.attempt_errors)
    missing, record = await _run({"tool": {"http": {"url": endpoint.url + "/nowhere"}}}, {})
    assert missing.phase == flowrun_api.RunPhase.FAILED and record.attempts == 1
    assert "HTTP 404" in (missing.message or "")

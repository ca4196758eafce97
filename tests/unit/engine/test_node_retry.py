"""Node retries: temporary failures are tried again per the node's policy, and each recorded."""

from __future__ import annotations

from typing import Any

import pytest

from agentflows.api import common
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.engine import capabilities, envelope, lifecycle, state, store

from .helpers import flow_spec, run_once

RunPhase = flowrun_api.RunPhase
Model, Tool, Http = flow_api.RetryOn.MODEL, flow_api.RetryOn.TOOL, flow_api.RetryOn.HTTP


class FlakyHost:
    """Fails the first ``failures`` calls of each node key with the given error, then succeeds."""

    def __init__(
        self,
        failures: int,
        *,
        retryable: bool = True,
        source: flow_api.RetryOn = Model,
        message: str = "HTTP 503 try {n}",
    ) -> None:
        self.failures = failures
        self.message = message
        self.retryable = retryable
        self.source = source
        self.calls: dict[str, int] = {}

    def _call(self, ctx: capabilities.NodeContext) -> capabilities.NodeResult:
        n = self.calls[ctx.node_key] = self.calls.get(ctx.node_key, 0) + 1
        if n <= self.failures:
            raise capabilities.CapabilityError(
                self.message.format(n=n), retryable=self.retryable, source=self.source
            )
        return capabilities.NodeResult(
            envelope.from_value(f"ok after {n}"), usage=common.Usage(prompt_tokens=1)
        )

    async def run_agent(self, task: Any, ctx: capabilities.NodeContext) -> Any:
        return self._call(ctx)

    async def complete(self, task: Any, ctx: capabilities.NodeContext) -> Any:
        return self._call(ctx)

    async def call_tool(self, task: Any, ctx: capabilities.NodeContext) -> Any:
        return self._call(ctx)


def _flow(node_retry: str = "", retry: str = "", kind: str = "llm") -> flow_api.FlowSpec:
    body = {
        "llm": 'llm: {model: {name: openai/test}, prompt: "hi"}',
        "tool": "tool: {python: {script: x}}",
        "map": 'map: {items: "=[1, 2]", tool: {python: {script: x}}}',
    }[kind]
    node_retry_line = f"nodeRetry: {node_retry}" if node_retry else ""
    retry_part = f", retry: {retry}" if retry else ""
    return flow_spec(f"""
{node_retry_line}
nodes:
  - {{id: n, {body}{retry_part}}}
""")


async def test_a_temporary_failure_is_retried_and_each_attempt_recorded_on_the_node() -> None:
    st = store.MemoryStore()
    host = FlakyHost(2)
    outcome = await run_once(_flow(retry="{maxAttempts: 3, backoffSeconds: 0}"), st, host)
    record = st.checkpoint.nodes["n"]
    assert outcome.phase == RunPhase.SUCCEEDED and outcome.output == "ok after 3"
    assert record.attempts == 3
    assert record.attempt_errors == ["attempt 1: HTTP 503 try 1", "attempt 2: HTTP 503 try 2"]


async def test_a_node_that_fails_every_attempt_fails_the_run_with_its_last_error() -> None:
    st = store.MemoryStore()
    outcome = await run_once(_flow(retry="{maxAttempts: 2, backoffSeconds: 0}"), st, FlakyHost(5))
    record = st.checkpoint.nodes["n"]
    assert outcome.phase == RunPhase.FAILED and outcome.reason == "NodeFailed"
    assert outcome.message == 'node "n" failed: HTTP 503 try 2'
    assert record.attempts == 2 and record.attempt_errors == ["attempt 1: HTTP 503 try 1"]


async def test_a_permanent_failure_is_not_retried() -> None:
    host = FlakyHost(1, retryable=False)
    outcome = await run_once(
        _flow(retry="{maxAttempts: 5, backoffSeconds: 0}"), store.MemoryStore(), host
    )
    assert outcome.phase == RunPhase.FAILED and host.calls == {"n": 1}


async def test_retry_on_chooses_which_temporary_failures_are_retried() -> None:
    policy = "{maxAttempts: 3, backoffSeconds: 0, retryOn: [Model, Http]}"
    tool_host = FlakyHost(1, source=Tool)
    http_host = FlakyHost(1, source=Http)
    tool_outcome = await run_once(_flow(retry=policy, kind="tool"), store.MemoryStore(), tool_host)
    http_outcome = await run_once(_flow(retry=policy, kind="tool"), store.MemoryStore(), http_host)
    assert tool_outcome.phase == RunPhase.FAILED and tool_host.calls == {"n": 1}
    assert http_outcome.phase == RunPhase.SUCCEEDED and http_host.calls == {"n": 2}


async def test_without_a_policy_a_node_is_tried_once() -> None:
    host = FlakyHost(1)
    outcome = await run_once(_flow(), store.MemoryStore(), host)
    assert outcome.phase == RunPhase.FAILED and host.calls == {"n": 1}


async def test_the_flow_node_retry_applies_to_every_node_unless_the_node_has_its_own() -> None:
    default = "{maxAttempts: 3, backoffSeconds: 0}"
    host = FlakyHost(2)
    outcome = await run_once(_flow(node_retry=default), store.MemoryStore(), host)
    assert outcome.phase == RunPhase.SUCCEEDED and host.calls == {"n": 3}
    host = FlakyHost(2)
    outcome = await run_once(
        _flow(node_retry=default, retry="{maxAttempts: 2, backoffSeconds: 0}"),
        store.MemoryStore(),
        host,
    )
    assert outcome.phase == RunPhase.FAILED and host.calls == {"n": 2}


async def test_each_map_item_is_retried_on_its_own() -> None:
    st = store.MemoryStore()
    host = FlakyHost(1, source=Tool)
    outcome = await run_once(
        _flow(retry="{maxAttempts: 2, backoffSeconds: 0}", kind="map"), st, host
    )
    assert outcome.phase == RunPhase.SUCCEEDED and host.calls == {"n[0]": 2, "n[1]": 2}
    assert st.checkpoint.nodes["n"].attempts == 1
    assert [st.checkpoint.nodes[f"n[{i}]"].attempt_errors for i in (0, 1)] == [
        ["attempt 1: HTTP 503 try 1"]
    ] * 2


async def test_the_observer_hears_each_retry() -> None:
    heard: list[str] = []

    def observe(event: state.RunEvent) -> None:
        heard.append(event.kind)

    await run_once(
        _flow(retry="{maxAttempts: 3, backoffSeconds: 0}"),
        store.MemoryStore(),
        FlakyHost(2),
        observer=observe,
    )
    assert heard == ["started", "retrying", "retrying", "succeeded"]


async def test_a_node_keeps_the_errors_of_only_its_last_five_attempts_each_cut_short() -> None:
    st = store.MemoryStore()
    policy = "{maxAttempts: 4, backoffSeconds: 0}"
    await run_once(_flow(retry=policy), st, FlakyHost(100))
    first = st.checkpoint.nodes["n"]
    assert len(first.attempt_errors) == 3
    st.checkpoint.outcome = None  # a second runner attempt of the same run
    st.checkpoint.nodes["n"] = first.model_copy(update={"phase": flowrun_api.NodePhase.RUNNING})
    await run_once(_flow(retry=policy), st, FlakyHost(100, message="x" * 1000))
    record = st.checkpoint.nodes["n"]
    assert record.attempts == 8 and len(record.attempt_errors) == 5
    assert record.attempt_errors[:2] == ["attempt 2: HTTP 503 try 2", "attempt 3: HTTP 503 try 3"]
    assert record.attempt_errors[-1] == "attempt 7: " + "x" * 501


@pytest.mark.parametrize("tries", [1, 2, 3, 8])
def test_backoff_doubles_up_to_its_cap_and_jitter_only_shortens_it(tries: int) -> None:
    policy = flow_api.NodeRetry(backoffSeconds=2, maxBackoffSeconds=10, jitter=0.5)
    full = min(2 * 2 ** (tries - 1), 10)
    delays = [lifecycle.backoff(policy, tries) for _ in range(200)]
    assert all(full * 0.5 <= d <= full for d in delays) and len(set(delays)) > 1
    exact = flow_api.NodeRetry(backoffSeconds=2, maxBackoffSeconds=10, jitter=0)
    assert lifecycle.backoff(exact, tries) == full

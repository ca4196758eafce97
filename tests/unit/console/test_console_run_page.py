"""A cluster run's page as a user sees it: facts, nodes, an offloaded output read on demand.

The console is served on loopback, acting for a forwarded user, over a loopback API server
holding one FlowRun and its ConfigMaps (``tests/support/fake_flowrun_api.py``); the same
pages on a real control plane: ``tests/cluster/test_console_cluster.py``.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import test_utils

from agentflows.console import app, identity
from tests.support.fake_flowrun_api import FakeFlowRunApi

AS_ALICE = {"X-Forwarded-User": "alice", "X-Forwarded-Groups": "editors"}
STATUS = {
    "phase": "Waiting",
    "attempt": 2,
    "startTime": "2026-12-02T13:00:00Z",
    "message": "waiting for a decision on request(s) gate",
    "usage": {"promptTokens": 7, "completionTokens": 2, "costUSD": 0.0125, "llmCalls": 1},
    "nodes": {
        "plan": {
            "phase": "Succeeded",
            "startedAt": "2026-12-02T13:00:01.000000Z",
            "finishedAt": "2026-12-02T13:00:03.500000Z",
            "attempts": 2,
            "attemptErrors": ["model timed out"],
            "outputRef": "configmap:r-out-plan:1",
            "output": {"preview": "..."},
            "usage": {"promptTokens": 7, "completionTokens": 2, "costUSD": 0.0125, "llmCalls": 1},
        },
        "gate": {"phase": "Waiting", "startedAt": "2026-12-02T13:00:04.000000Z"},
    },
    "requests": {"gate": {"node": "gate", "kind": "approval", "message": "Ship it?"}},
}


@pytest.fixture
async def console() -> AsyncIterator[test_utils.TestClient]:
    fake = FakeFlowRunApi("team", "r", spec={"flow": "f", "input": {"q": 1}}, status=STATUS)
    part = json.dumps({"questions": ["why", "how"]})
    fake.configmaps["r-out-plan-0"] = {
        "metadata": {"name": "r-out-plan-0"},
        "data": {"part-0000": part},
    }
    async with fake.client() as api:
        gate = identity.Gate(api, trusted_proxy=ipaddress.ip_network("127.0.0.1/32"))
        server = test_utils.TestServer(app.cluster_app(gate, "team"))
        async with test_utils.TestClient(server) as client:
            yield client


async def _page(console: test_utils.TestClient, path: str) -> str:
    """The page at ``path`` as alice sees it (it must be there)."""
    answer = await console.get(path, headers=AS_ALICE)
    page = await answer.text()
    assert answer.status == 200, page
    return page


async def test_the_run_page_shows_the_runs_facts_its_nodes_and_the_pending_request(
    console: test_utils.TestClient,
) -> None:
    page = await _page(console, "/runs/team/r")

    assert '<span class="phase phase-Waiting">Waiting</span>' in page
    assert "<dd>2</dd>" in page  # the attempt
    assert "7 prompt + 2 completion, 1 model call(s), 0 tool call(s), $0.0125" in page
    assert "waiting for a decision on request(s) gate" in page
    assert 'data-field="duration" class="muted">2s<' in page  # how long plan took
    assert "model timed out" in page  # an earlier attempt's error
    assert 'href="/runs/team/r/nodes/plan/output"' in page
    assert "Ship it?" in page


async def test_an_offloaded_output_is_read_back_from_its_configmaps_on_demand(
    console: test_utils.TestClient,
) -> None:
    page = await _page(console, "/runs/team/r/nodes/plan/output")

    assert "questions" in page and "why" in page
    assert "preview" not in page

"""The API client reports how long each answered request took (the operator's API histogram)."""

from __future__ import annotations

import asyncio

from agentflows.controller import metrics as metrics_mod
from agentflows.kube import client as kube
from agentflows.kube import kubeconfig
from tests.support.endpoint import LoopbackEndpoint


def test_each_answered_request_reports_its_method_and_seconds_including_a_slow_one() -> None:
    endpoint = LoopbackEndpoint().start()
    metrics = metrics_mod.Metrics()
    seen: list[tuple[str, float]] = []

    def answered(method: str, seconds: float) -> None:
        seen.append((method, seconds))
        metrics.api_answered(method, seconds)

    async def go() -> None:
        config = kubeconfig.Config(server=endpoint.url)
        async with kube.Client(config, retry_seconds=0) as api:
            api.on_response = answered
            await api.get("/echo")
            await api.create("/echo", {"a": 1})
            await api.request_text("GET", "/slow")

    try:
        asyncio.run(go())
    finally:
        endpoint.stop()
    assert [method for method, _ in seen] == ["GET", "POST", "GET"]
    assert seen[2][1] >= 2.0  # /slow answers after 2 s
    sample = metrics.registry.get_sample_value
    assert sample("agentflows_api_request_seconds_count", {"method": "GET"}) == 2
    assert sample("agentflows_api_request_seconds_count", {"method": "POST"}) == 1

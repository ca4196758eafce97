"""The webhook receiver against the real API server: outsiders cost it no API requests.

Issue 11, item 7: each request naming an unknown Flow used to cost a GET. The receiver runs
with its own least-privilege token (config/webhook/rbac.yaml bound in the test namespace), and
a FlowSchema matching only that ServiceAccount makes the API server count the receiver's own
requests (``apiserver_flowcontrol_dispatched_requests_total`` of that schema), so other clients
of the shared control plane do not disturb the count.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from agentflows.kube import client as kube_client
from agentflows.triggers import signing, webhook
from tests.cluster.harness import Cluster
from tests.cluster.kube_fixtures import crds, kube
from tests.cluster.test_triggers import create_flow, eventually, webhook_client
from tests.support import api_counts

pytestmark = pytest.mark.cluster
__all__ = ["crds", "kube"]

KEY = b"s3cret"


@pytest.fixture
async def served(
    control_plane: Cluster,
    namespace: str,
    kube: kube_client.Client,
) -> AsyncIterator[tuple[str, str]]:
    """(base URL, FlowSchema name) of a receiver serving the namespace with its own token."""
    await kube.create(
        kube_client.path_of("secrets", namespace),
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "hook"},
            "data": {"hmac": base64.b64encode(KEY).decode()},
        },
    )
    trigger = {"name": "push", "webhook": {"secret": {"name": "hook", "key": "hmac"}}}
    await create_flow(kube, namespace, "ci", [trigger])
    schema = await api_counts.install_schema(
        kube, f"test-webhook-{namespace}", "agentflows-webhook", namespace
    )
    async with webhook_client(control_plane, namespace) as api:
        settings = webhook.Settings(namespaces=(namespace,))
        listening = await webhook.listen(webhook.make_app(api, settings), "127.0.0.1", 0)
        base = f"http://127.0.0.1:{listening.port}"
        try:
            async with aiohttp.ClientSession() as session:

                async def ready() -> bool:
                    async with session.get(f"{base}/readyz") as response:
                        return response.status == 200

                await eventually(ready, 30, "the receiver to list Flows")
            yield base, schema
        finally:
            await listening.close()
            await api_counts.remove_schema(kube, schema)


async def test_requests_for_unknown_flows_cost_the_api_server_nothing(
    served: tuple[str, str],
    namespace: str,
    kube: kube_client.Client,
) -> None:
    base, schema = served
    body = json.dumps({"ref": "main"}).encode()
    headers = {signing.SIGNATURE_HEADER: signing.signature(KEY, body)}
    async with aiohttp.ClientSession() as session:
        # A known trigger's first delivery reads its Secret: the count is live.
        before_known = await api_counts.requests_of(kube, schema)
        async with session.post(
            f"{base}/hooks/{namespace}/ci/push", data=body, headers=headers
        ) as r:
            assert r.status == 202
        after_known = await api_counts.requests_of(kube, schema)
        assert after_known - before_known == 2  # GET the Secret, POST the FlowRun

        answers: dict[tuple[int, Any], int] = {}
        for index in range(300):
            url = f"{base}/hooks/{namespace}/flow-{index}/push"
            async with session.post(url, data=body, headers=headers) as response:
                key = (response.status, json.dumps(await response.json()))
                answers[key] = answers.get(key, 0) + 1
        after_unknown = await api_counts.requests_of(kube, schema)
    assert answers == {(401, json.dumps({"error": webhook.UNAUTHORIZED})): 300}
    assert after_unknown - after_known == 0

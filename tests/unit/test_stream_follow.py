"""Following a run's streamed answers from its pods' logs (``runner.stream_log.follow_run``).

An aiohttp app on loopback plays the API server: the FlowRun's status as the test sets it, and
each pod's log answered as ``follow=true`` answers it (400 while the container is being
created, then the lines, ending when the container ends). The real API server and kubelet are
in tests/cluster/test_cli_cluster.py and test_console_browser.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from agentflows.kube import client as kube
from agentflows.kube import kubeconfig
from agentflows.runner import stream_log

RUN = "/apis/agentflows.io/v1alpha1/namespaces/team/flowruns/r"


def _framed(**event: Any) -> str:
    return json.dumps({"stream": event})


class FakeRunApi:
    """One FlowRun and its pods' logs; ``logs[pod]`` is None while the container is created."""

    def __init__(self) -> None:
        self.status: dict[str, Any] = {"phase": "Running", "pod": "r-1"}
        self.logs: dict[str, list[str] | None] = {}
        #: Set when a pod's log is asked for while it is still being created.
        self.asked_early = asyncio.Event()
        self.log_requests: list[str] = []
        #: pod -> lines after which its next log answer breaks off (once)
        self.break_after: dict[str, int] = {}

    async def answer(self, request: web.Request) -> web.StreamResponse:
        if request.path == RUN:
            return web.json_response({"metadata": {"name": "r"}, "status": self.status})
        pod = request.path.split("/")[-2]
        self.log_requests.append(f"{pod} follow={request.query.get('follow')}")
        if pod == "forbidden":
            return web.json_response({"reason": "Forbidden", "message": "no"}, status=403)
        if pod not in self.logs:
            return web.json_response({"reason": "NotFound", "message": pod}, status=404)
        lines = self.logs[pod]
        if lines is None:
            self.asked_early.set()
            message = f'container "runner" in pod "{pod}" is waiting to start'
            return web.json_response({"reason": "BadRequest", "message": message}, status=400)
        response = web.StreamResponse()
        await response.prepare(request)
        cut = self.break_after.pop(pod, None)
        for number, line in enumerate(lines):
            if number == cut and request.transport is not None:
                request.transport.close()  # the connection drops mid-way
                return response
            await response.write(line.encode() + b"\n")
        return response


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeRunApi, kube.Client]]:
    api = FakeRunApi()
    app = web.Application()
    app.router.add_route("GET", "/{path:.*}", api.answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    client = kube.Client(kubeconfig.Config(server=f"http://127.0.0.1:{port}"), retry_seconds=0)
    yield api, client
    await client.close()
    await runner.cleanup()


async def test_the_follower_waits_for_each_pods_log_and_yields_only_framed_lines_until_the_end(
    fake: tuple[FakeRunApi, kube.Client],
) -> None:
    api, client = fake
    api.logs["r-1"] = None
    events: list[dict[str, Any]] = []
    seen = {2: asyncio.Event(), 4: asyncio.Event()}

    async def follow() -> None:
        async for event in stream_log.follow_run(client, "team", "r"):
            events.append(event)
            if len(events) in seen:
                seen[len(events)].set()

    following = asyncio.create_task(follow())
    await asyncio.wait_for(api.asked_early.wait(), 10)
    # the first pod's container is up: its log holds progress lines and the framed pieces;
    # it ends while the run goes on in a second attempt
    api.logs["r-1"] = [
        "2026-12-02T06:23:03Z run team/r attempt 1",
        _framed(node="answer", delta="Restart "),
        '{"streamed": "a log line that only looks like one"}',
        _framed(node="answer", restart=True),
    ]
    api.logs["r-2"] = [
        _framed(node="answer", delta="Drain first."),
        _framed(node="answer", end=True),
    ]
    await asyncio.wait_for(seen[2].wait(), 10)
    api.status = {"phase": "Running", "pod": "r-2"}
    await asyncio.wait_for(seen[4].wait(), 10)
    api.status = {"phase": "Succeeded", "pod": "r-2"}
    await asyncio.wait_for(following, 10)

    assert events == [
        {"node": "answer", "delta": "Restart "},
        {"node": "answer", "restart": True},
        {"node": "answer", "delta": "Drain first."},
        {"node": "answer", "end": True},
    ]
    assert api.log_requests[0] == "r-1 follow=true"
    assert api.log_requests[-1] == "r-2 follow=true"


async def test_a_refusal_to_read_the_pods_log_is_raised_with_the_api_servers_status(
    fake: tuple[FakeRunApi, kube.Client],
) -> None:
    api, client = fake
    api.status = {"phase": "Running", "pod": "forbidden"}
    with pytest.raises(kube.ApiError) as refused:
        async for _ in stream_log.follow_run(client, "team", "r"):
            pass
    assert refused.value.status == 403


async def test_a_run_that_ended_before_its_pods_log_could_be_read_ends_the_follower(
    fake: tuple[FakeRunApi, kube.Client],
) -> None:
    api, client = fake
    api.status = {"phase": "Failed", "pod": "r-1"}  # the pod is gone: 404
    events = [e async for e in stream_log.follow_run(client, "team", "r")]
    assert events == []


async def test_a_follow_that_broke_off_goes_on_past_what_was_already_shown(
    fake: tuple[FakeRunApi, kube.Client],
) -> None:
    api, client = fake
    api.logs["r-1"] = [_framed(node="a", delta=word) for word in ("one ", "two ", "three")]
    api.break_after["r-1"] = 2
    events: list[dict[str, Any]] = []
    async for event in stream_log.follow_run(client, "team", "r"):
        events.append(event)
        if len(events) == 3:
            api.status = {"phase": "Succeeded", "pod": "r-1"}
    assert [e["delta"] for e in events] == ["one ", "two ", "three"]
    assert api.log_requests[:2] == ["r-1 follow=true", "r-1 follow=true"]

"""The API client tries a request again while a retry may help, and never otherwise."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiohttp import web

from agentflows.kube import client as kube
from agentflows.kube import kubeconfig


async def _answering(
    statuses: list[int], method: str = "GET", retry_after: tuple[str | None, ...] = ()
) -> tuple[list[int], object]:
    """Serve ``statuses`` one per request on loopback, then ask once; the statuses sent.

    ``retry_after[i]``, when given and not None, is answer i's ``Retry-After`` header.
    """
    sent: list[int] = []

    async def handle(request: web.Request) -> web.Response:
        status = statuses[min(len(sent), len(statuses) - 1)]
        asked = retry_after[len(sent)] if len(sent) < len(retry_after) else None
        sent.append(status)
        body = {"kind": "Status", "reason": f"R{status}", "message": f"answer {len(sent)}"}
        headers = {"Retry-After": asked} if asked is not None else None
        answer = {"items": []} if status == 200 else body
        return web.json_response(answer, status=status, headers=headers)

    app = web.Application()
    app.router.add_route("*", "/thing", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with kube.Client(kubeconfig.Config(server=f"http://127.0.0.1:{port}")) as api:
            try:
                return sent, await api.request(method, "/thing")
            except kube.ApiError as exc:
                return sent, exc
    finally:
        await runner.cleanup()


def test_429_408_and_5xx_are_tried_again_with_doubling_delays_until_one_passes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="agentflows.kube.client")
    sent, answer = asyncio.run(_answering([503, 429, 408, 200]))
    assert sent == [503, 429, 408, 200] and answer == {"items": []}
    waits = [r.getMessage().rsplit(" ", 1)[1] for r in caplog.records if "retrying" in r.message]
    assert waits == ["0.2s", "0.4s", "0.8s"]


def test_a_retry_after_longer_than_the_backoff_is_waited_and_a_shorter_one_is_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="agentflows.kube.client")
    sent, answer = asyncio.run(_answering([429, 503, 200], retry_after=("1", "0")))
    assert sent == [429, 503, 200] and answer == {"items": []}
    waits = [
        r.getMessage().split("retrying in ", 1)[1]
        for r in caplog.records
        if "retrying" in r.message
    ]
    assert waits == ["1.0s (Retry-After: 1s)", "0.4s (Retry-After: 0s)"]


def test_a_retry_after_past_the_clients_retry_window_gives_the_error_at_once() -> None:
    sent, answer = asyncio.run(_answering([429, 200], retry_after=("3600",)))
    assert sent == [429]
    assert isinstance(answer, kube.ApiError) and (answer.status, answer.retry_after) == (429, 3600)


@pytest.mark.parametrize("status", [400, 403, 404, 409, 422])
def test_an_answer_no_retry_can_change_raises_at_the_first_try(status: int) -> None:
    sent, answer = asyncio.run(_answering([status, 200], method="POST"))
    assert sent == [status]
    assert isinstance(answer, kube.ApiError) and answer.status == status

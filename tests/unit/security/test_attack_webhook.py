"""Attacks on the webhook receiver (issue 11, item 7), each of which must fail.

The receiver runs for real on 127.0.0.1 (``webhook.listen``, as ``agentflows webhook`` serves
it) against a fake API server (tests/support/fake_kube.py) that counts what it is asked; the
attacker speaks raw HTTP over sockets where a well-behaved client library would not do what an
attacker does (stall headers, stall a body). Limits are set small so each attack hits them fast.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from agentflows.triggers import signing, webhook
from tests.support.fake_kube import FakeKubeApi

KEY = b"hook-key"
HOOK = "/hooks/team/ci/push"
Start = Callable[..., Awaitable[tuple[str, FakeKubeApi]]]


def fake_api() -> FakeKubeApi:
    fake = FakeKubeApi()
    fake.flows.append(
        {
            "apiVersion": "agentflows.io/v1alpha1",
            "kind": "Flow",
            "metadata": {"name": "ci", "namespace": "team", "uid": "u1"},
            "spec": {
                "nodes": [{"id": "a", "transform": "=.run.input"}],
                "triggers": [
                    {
                        "name": "push",
                        "webhook": {"secret": {"name": "hook", "key": "hmac"}},
                        "input": {"ref": "=.run.trigger.payload.ref"},
                        "rateLimitPerMinute": 1000,
                    },
                    {
                        "name": "keyless",
                        "webhook": {"secret": {"name": "gone", "key": "hmac"}},
                    },
                ],
            },
        }
    )
    fake.secrets["hook"] = {"hmac": KEY}
    return fake


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    """``await start(**settings)`` -> (base URL, fake API) of a running receiver."""
    stack: list[Any] = []

    async def run(**settings: Any) -> tuple[str, FakeKubeApi]:
        fake = fake_api()
        api = await fake.client()
        listening = await webhook.listen(
            webhook.make_app(api, webhook.Settings(**settings)), "127.0.0.1", 0
        )
        stack.append((listening, api, fake))
        base = f"http://127.0.0.1:{listening.port}"
        async with aiohttp.ClientSession() as session:
            for _ in range(200):
                async with session.get(f"{base}/readyz") as response:
                    if response.status == 200:
                        return base, fake
                await asyncio.sleep(0.02)
        pytest.fail("the receiver never became ready")

    yield run
    for listening, api, fake in stack:
        await listening.close()
        await api.close()
        await fake.close()


async def post(base: str, path: str, body: bytes, headers: dict[str, str] | None = None) -> Any:
    async with (
        aiohttp.ClientSession() as session,
        session.post(base + path, data=body, headers=headers or {}) as response,
    ):
        return response.status, await response.json()


def signed(body: bytes, key: bytes = KEY, **headers: str) -> dict[str, str]:
    return {signing.SIGNATURE_HEADER: signing.signature(key, body), **headers}


async def raw(base: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = base.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


def head(path: str = HOOK, length: int = 1000, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n{extra}\r\n"
    ).encode()


async def answer(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes (a generous bound, not a timing check)."""
    return await asyncio.wait_for(reader.read(), 30)


# --- slow clients -----------------------------------------------------------------------------


async def test_a_body_that_never_finishes_is_answered_408_and_the_connection_closed(
    start: Start,
) -> None:
    base, _ = await start(body_timeout_seconds=0.5)
    reader, writer = await raw(base)
    writer.write(head(length=1000) + b'{"ref": ')
    await writer.drain()
    received = await answer(reader)
    assert received.startswith(b"HTTP/1.1 408")
    assert b"did not arrive within" in received
    writer.close()


async def test_headers_that_never_finish_are_cut_off(start: Start) -> None:
    base, _ = await start(header_timeout_seconds=0.5)
    reader, writer = await raw(base)
    writer.write(b"POST /hooks/team/ci/push HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    await writer.drain()
    assert await answer(reader) == b""  # closed without an answer
    writer.close()


async def test_connections_over_the_cap_are_refused_and_the_held_ones_expire(
    start: Start,
) -> None:
    base, _ = await start(max_connections=5, header_timeout_seconds=1)
    held = [await raw(base) for _ in range(5)]
    for _, writer in held:
        writer.write(b"POST /hooks/team/ci/push HTTP/1.1\r\n")
        await writer.drain()
    reader, writer = await raw(base)
    assert (await answer(reader)).startswith(b"HTTP/1.1 503")
    writer.close()
    for held_reader, held_writer in held:
        assert await answer(held_reader) == b""
        held_writer.close()
    body = b'{"ref": "main"}'
    assert (await post(base, HOOK, body, signed(body)))[0] == 202


async def test_one_peers_slow_connections_leave_room_for_signed_deliveries_of_others(
    start: Start,
) -> None:
    # Before the fix any source could take every slot: 5 slow connections from 127.0.0.1
    # made a signed delivery from 127.0.0.2 get 503.
    base, _ = await start(max_connections=6, max_connections_per_peer=5, header_timeout_seconds=30)
    held = [await raw(base) for _ in range(5)]
    for _, writer in held:
        writer.write(b"POST /hooks/team/ci/push HTTP/1.1\r\n")
        await writer.drain()
    reader, writer = await raw(base)
    assert (await answer(reader)).startswith(b"HTTP/1.1 503")  # the same peer: refused
    writer.close()
    body = b'{"ref": "main"}'
    connector = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.post(base + HOOK, data=body, headers=signed(body)) as response,
    ):
        assert response.status == 202, await response.text()
    for _, held_writer in held:
        held_writer.close()


async def buffered_at_least(base: str, size: int) -> None:
    """Wait until the receiver's ``agentflows_webhook_buffered_bytes`` reaches ``size``."""
    async with aiohttp.ClientSession() as session:
        for _ in range(500):
            async with session.get(f"{base}/metrics") as response:
                text = await response.text()
            for line in text.splitlines():
                name, _, value = line.partition(" ")
                if name == "agentflows_webhook_buffered_bytes" and float(value) >= size:
                    return
            await asyncio.sleep(0.01)
    pytest.fail(f"the receiver never held {size} bytes")


async def test_body_buffering_is_bounded_over_all_requests(start: Start) -> None:
    base, fake = await start(max_buffered_bytes=64 * 1024, body_timeout_seconds=5)
    _, writer = await raw(base)
    writer.write(head(length=100_000) + b" " * 60_000)  # holds 60 kB and stalls
    await writer.drain()
    await buffered_at_least(base, 60_000)  # the receiver took the stalled bytes into its budget
    body = json.dumps({"ref": "x" * 20_000}).encode()
    status, answered = await post(base, HOOK, body, signed(body))
    assert (status, answered) == (503, {"error": "too many deliveries at once"})
    assert fake.created == []
    writer.close()


# --- outsiders learn nothing and cost nothing --------------------------------------------------


async def test_requests_for_unknown_flows_make_no_api_call(start: Start) -> None:
    base, fake = await start()
    body = b'{"ref": "main"}'
    async with aiohttp.ClientSession() as session:
        for index in range(300):
            url = f"{base}/hooks/team/flow-{index}/push"
            async with session.post(url, data=body, headers=signed(body)) as response:
                assert response.status == 401
    assert fake.gets("flows") == 1  # the receiver's one list at start
    assert fake.gets("secrets") == 0


async def test_an_unknown_trigger_and_a_bad_signature_get_the_same_answer(start: Start) -> None:
    base, _ = await start()
    body = b'{"ref": "main"}'
    answers = {
        "unknown namespace": await post(base, "/hooks/other/ci/push", body, signed(body)),
        "unknown flow": await post(base, "/hooks/team/nope/push", body, signed(body)),
        "unknown trigger": await post(base, "/hooks/team/ci/nope", body, signed(body)),
        "trigger whose Secret is missing": await post(
            base, "/hooks/team/ci/keyless", body, signed(body)
        ),
        "no signature": await post(base, HOOK, body),
        "wrong key": await post(base, HOOK, body, signed(body, key=b"guess")),
        "tampered body": await post(base, HOOK, body + b" ", signed(body)),
    }
    assert set(map(repr, answers.values())) == {repr((401, {"error": webhook.UNAUTHORIZED}))}


async def test_an_unknown_trigger_waits_for_the_body_like_a_known_one(start: Start) -> None:
    base, _ = await start(body_timeout_seconds=0.5)
    received = {}
    for path in (HOOK, "/hooks/team/nope/push"):
        reader, writer = await raw(base)
        writer.write(head(path=path, length=100) + b"{")
        await writer.drain()
        received[path] = (await answer(reader)).split(b"\r\n", 1)[0]
        writer.close()
    assert set(received.values()) == {b"HTTP/1.1 408 Request Timeout"}


# --- replays -----------------------------------------------------------------------------------


async def test_a_captured_body_replayed_with_a_new_or_no_delivery_id_starts_no_run(
    start: Start,
) -> None:
    base, fake = await start()
    body = b'{"ref": "main"}'
    first = await post(base, HOOK, body, signed(body, **{"X-GitHub-Delivery": "d1"}))
    assert first[0] == 202
    replays = [
        await post(base, HOOK, body, signed(body, **{"X-GitHub-Delivery": "d2"})),
        await post(base, HOOK, body, signed(body, **{"X-Delivery-Id": "d3"})),
        await post(base, HOOK, body, signed(body)),
    ]
    assert [status for status, _ in replays] == [409, 409, 409]
    assert "replay" in replays[0][1]["error"]
    redelivery = await post(base, HOOK, body, signed(body, **{"X-GitHub-Delivery": "d1"}))
    assert redelivery == (200, {"flowRun": first[1]["flowRun"], "duplicate": True})
    assert len(fake.created) == 1


def standard_headers(body: bytes, key: bytes, delivery: str, stamp: int) -> dict[str, str]:
    return {
        signing.STANDARD_ID: delivery,
        signing.STANDARD_TIMESTAMP: str(stamp),
        signing.STANDARD_SIGNATURE: signing.standard_signature(key, delivery, stamp, body),
    }


async def test_a_signed_timestamp_expires_a_captured_delivery(start: Start) -> None:
    base, fake = await start()
    fake.secrets["hook"] = {"hmac": b"whsec_" + base64.b64encode(b"standard-key")}
    body = b'{"ref": "main"}'
    now = int(time.time())
    fresh = standard_headers(body, fake.secrets["hook"]["hmac"], "msg_1", now)
    assert (await post(base, HOOK, body, fresh))[0] == 202

    stale = standard_headers(body, fake.secrets["hook"]["hmac"], "msg_2", now - 600)
    assert await post(base, HOOK, body, stale) == (
        401,
        {"error": "webhook-timestamp is more than 300 s from now"},
    )
    renamed = dict(fresh, **{signing.STANDARD_ID: "msg_3"})  # the id is signed too
    assert (await post(base, HOOK, body, renamed))[0] == 401
    assert (await post(base, HOOK, body, fresh))[1]["duplicate"] is True
    assert len(fake.created) == 1


# --- hostile JSON ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [b"[" * 1000 + b"]" * 1000, b'{"a":' * 1000 + b"1" + b"}" * 1000, b"[" * 65 + b"]" * 65],
    ids=["array-1000", "object-1000", "array-65"],
)
async def test_deeply_nested_json_is_refused_with_400(start: Start, body: bytes) -> None:
    base, fake = await start()
    status, answered = await post(base, HOOK, body, signed(body))
    assert (status, answered) == (400, {"error": "body nests deeper than 64 arrays/objects"})
    assert fake.created == []


async def test_json_nested_to_the_limit_is_accepted(start: Start) -> None:
    base, fake = await start()
    body = b'{"ref": ' + b"[" * 63 + b"]" * 63 + b"}"
    assert (await post(base, HOOK, body, signed(body)))[0] == 202
    assert len(fake.created) == 1

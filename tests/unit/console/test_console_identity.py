"""Who the console believes: a forwarded user only from the trusted proxy, else nobody.

The console is served on loopback and asked over real HTTP. Its API client points at a port
where nothing listens: every refusal here happens before any call to an API server (a call
would answer 502 "Unreachable", not 401).
"""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pytest
from aiohttp import test_utils
from click.testing import CliRunner

from agentflows.cli import main as cli
from agentflows.console import app, identity
from agentflows.kube import client as kube
from agentflows.kube import kubeconfig

Serve = Callable[..., AbstractAsyncContextManager[test_utils.TestClient]]


@pytest.fixture
def serve() -> Serve:
    @asynccontextmanager
    async def serving(**gate_options: object) -> AsyncIterator[test_utils.TestClient]:
        api = kube.Client(kubeconfig.Config(server="https://127.0.0.1:9"), retry_seconds=0)
        gate = identity.Gate(api, **gate_options)  # type: ignore[arg-type]
        async with test_utils.TestClient(
            test_utils.TestServer(app.cluster_app(gate, "default"))
        ) as client:
            yield client

    return serving


async def test_a_forwarded_user_from_outside_the_trusted_network_is_not_believed(
    serve: Serve,
) -> None:
    async with serve(trusted_proxy=ipaddress.ip_network("10.0.0.0/8")) as console:
        answer = await console.get("/runs", headers={"X-Forwarded-User": "alice"})
        assert answer.status == 401
        assert "acts only for a user its proxy vouches for" in await answer.text()


async def test_a_forwarded_user_from_the_trusted_proxy_is_acted_for(serve: Serve) -> None:
    async with serve(trusted_proxy=ipaddress.ip_network("127.0.0.1/32")) as console:
        answer = await console.get(
            "/runs", headers={"X-Forwarded-User": "alice", "X-Forwarded-Groups": "editors"}
        )
        # believed: the console went on to call the API server as alice (none listens here)
        assert answer.status == 502
        page = await answer.text()
        assert "cannot reach https://127.0.0.1:9" in page
        assert '<span class="user">alice</span>' in page


async def test_a_bearer_token_is_refused_unless_tokens_are_passed(serve: Serve) -> None:
    async with serve(trusted_proxy=ipaddress.ip_network("127.0.0.1/32")) as console:
        answer = await console.get("/runs", headers={"Authorization": "Bearer abc"})
        assert answer.status == 401
    async with serve(pass_tokens=True) as console:
        answer = await console.get("/runs", headers={"Authorization": "Bearer abc"})
        assert answer.status == 502
        assert '<span class="user">your token</span>' in await answer.text()


async def test_the_probe_answers_without_an_identity(serve: Serve) -> None:
    async with serve(trusted_proxy=ipaddress.ip_network("10.0.0.0/8")) as console:
        answer = await console.get("/healthz")
        assert answer.status == 200 and await answer.text() == "ok"
        assert answer.headers["X-Frame-Options"] == "DENY"


async def test_a_post_from_another_sites_page_is_refused_before_anything_runs(
    serve: Serve,
) -> None:
    async with serve(trusted_proxy=ipaddress.ip_network("127.0.0.1/32")) as console:
        answer = await console.post(
            "/requests/ns/run/review",
            data={"decision": "approve", "csrf": "x"},
            headers={"X-Forwarded-User": "alice", "Origin": "https://elsewhere.example"},
        )
        assert answer.status == 403
        assert "cross-site request refused" in await answer.text()


def test_the_console_acting_as_your_kubeconfig_user_refuses_to_listen_beyond_loopback() -> None:
    result = CliRunner().invoke(cli.main, ["console", "--host", "0.0.0.0"])
    assert result.exit_code == 2
    assert "without --trust-proxy-from or --pass-tokens the console acts as your own user" in (
        result.stderr
    )


def test_a_trusted_proxy_that_is_not_a_network_is_refused_with_an_example() -> None:
    result = CliRunner().invoke(cli.main, ["console", "--trust-proxy-from", "proxy"])
    assert result.exit_code == 2
    assert "'proxy' is not an address or network (e.g. 10.0.0.5/32" in result.stderr


OPERATOR = "system:serviceaccount:agentflows-system:agentflows-operator"


async def test_a_forwarded_system_service_account_is_refused_and_never_impersonated(
    serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    async with serve(trusted_proxy=ipaddress.ip_network("127.0.0.1/32")) as console:
        for _ in range(2):
            answer = await console.get("/runs", headers={"X-Forwarded-User": OPERATOR})
            # refused before any call: one to the API server would have answered 502
            assert answer.status == 403
            assert f"the proxy forwarded the user {OPERATOR!r}, a Kubernetes system" in (
                await answer.text()
            )
    refusals = [r for r in caplog.records if "refused to impersonate" in r.getMessage()]
    assert len(refusals) == 1, "each refused name is logged once"


async def test_a_forwarded_system_masters_group_is_refused(serve: Serve) -> None:
    async with serve(trusted_proxy=ipaddress.ip_network("127.0.0.1/32")) as console:
        answer = await console.post(
            "/flows/ns/f/start",
            data={"csrf": "x"},
            headers={"X-Forwarded-User": "vic", "X-Forwarded-Groups": "viewers, system:masters"},
        )
        assert answer.status == 403
        assert "the group 'system:masters', a Kubernetes system identity" in await answer.text()


async def test_a_system_identity_the_configuration_allows_is_acted_for(serve: Serve) -> None:
    async with serve(
        trusted_proxy=ipaddress.ip_network("127.0.0.1/32"), allowed_system=[OPERATOR]
    ) as console:
        answer = await console.get("/runs", headers={"X-Forwarded-User": OPERATOR})
        assert answer.status == 502
        assert "cannot reach https://127.0.0.1:9" in await answer.text()
        other = await console.get(
            "/runs", headers={"X-Forwarded-User": OPERATOR, "X-Forwarded-Groups": "system:nodes"}
        )
        assert other.status == 403

"""``agentflows console --local`` as another site and a hostile URL would use it.

Real HTTP to the console app on a loopback port, real local runs made by ``agentflows run``
subprocesses (the fixtures of :mod:`test_console_local`, shared by ``conftest``): a page of another origin whose name
points at 127.0.0.1 (DNS rebinding), a run name that is a path, and a run some process is
running while the page asks to resume it.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import yarl
from aiohttp import test_utils

from agentflows.cli import console_command, local_runs
from agentflows.console import app, identity
from agentflows.kube import client as kube
from agentflows.kube import kubeconfig
from tests.unit.console.test_console_local import AGENTFLOWS, _csrf
from tests.unit.test_cli_local_runs import _wait_for_node
from tests.unit.test_cli_local_state import COUNTED_HOLD_FLOW


def _port(client: test_utils.TestClient) -> int:
    port = client.server.port
    assert port is not None
    return port


@pytest.mark.parametrize("host", ["rebind.example:{port}", "127.0.0.1.nip.example:{port}",
                                  "127.0.0.1:1", "localhost"])  # fmt: skip
async def test_a_page_asked_for_by_another_host_name_is_421_and_shows_no_csrf_token(
    console: test_utils.TestClient, host: str
) -> None:
    answer = await console.get("/local/gate-1", headers={"Host": host.format(port=_port(console))})
    body = await answer.text()
    assert answer.status == 421, body
    assert "DNS rebinding" in body and 'name="csrf"' not in body


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST:{port}"])
async def test_the_console_answers_to_its_own_loopback_names_and_port(
    console: test_utils.TestClient, host: str
) -> None:
    answer = await console.get("/local/gate-1", headers={"Host": host.format(port=_port(console))})
    assert answer.status == 200 and 'name="csrf"' in await answer.text()


async def test_a_decision_posted_by_a_rebound_origin_is_refused_and_decides_nothing(
    console: test_utils.TestClient, waiting_run: Path
) -> None:
    port = _port(console)
    token = _csrf(await (await console.get("/local/gate-1")).text())
    form = {"decision": "approve", "csrf": token}
    rebound = {"Host": f"rebind.example:{port}", "Origin": f"http://rebind.example:{port}"}
    refused = await console.post("/local/gate-1/requests/review", data=form, headers=rebound)
    assert refused.status == 421
    # The right Host, another site's Origin: refused too.
    foreign = {"Origin": f"http://rebind.example:{port}"}
    refused = await console.post("/local/gate-1/requests/review", data=form, headers=foreign)
    assert refused.status == 403 and "Origin" in await refused.text()
    run = local_runs.read(waiting_run, "gate-1")
    assert run is not None and run["status"]["phase"] == "Waiting"
    assert "decision" not in run["status"]["requests"]["review"]


@pytest.fixture
def other_state(waiting_run: Path) -> Path:
    """A second state directory beside the console's, with a run ``elsewhere`` waiting."""
    other = waiting_run.parent / "other-state"
    for suffix in (".json", ".snapshot.json"):
        data = (waiting_run / f"gate-1{suffix}").read_bytes()
        other.mkdir(exist_ok=True)
        (other / f"elsewhere{suffix}").write_bytes(data)
    return other


@pytest.mark.parametrize(
    "path",
    ["/local/..%2fother-state%2felsewhere", "/local/..%2fother-state%2felsewhere/graph.svg",
     "/events/local/..%2fother-state%2felsewhere", "/local/Gate-1"],
)  # fmt: skip
async def test_a_run_name_that_is_a_path_shows_nothing_of_another_directory(
    console: test_utils.TestClient, other_state: Path, path: str
) -> None:
    answer = await console.get(yarl.URL(path, encoded=True))
    assert answer.status == 404
    assert "is not a run name" in await answer.text()


async def test_a_decision_posted_to_a_run_name_that_is_a_path_decides_nothing(
    console: test_utils.TestClient, other_state: Path
) -> None:
    token = _csrf(await (await console.get("/local/gate-1")).text())
    for action in ("requests/review", "resume"):
        url = yarl.URL(f"/local/..%2fother-state%2felsewhere/{action}", encoded=True)
        answer = await console.post(url, data={"decision": "approve", "csrf": token})
        assert answer.status == 404, action
    run = local_runs.read(other_state, "elsewhere")
    assert run is not None and "decision" not in run["status"]["requests"]["review"]
    assert not (other_state / "elsewhere.console.log").exists()


async def test_the_requests_page_lists_the_local_pending_requests_with_their_forms(
    console: test_utils.TestClient,
) -> None:
    answer = await console.get("/requests")
    page = await answer.text()
    assert answer.status == 200, page
    assert "1 pending request(s)" in page
    assert 'action="/local/gate-1/requests/review"' in page and 'name="csrf"' in page


async def test_the_flows_page_lists_the_flows_of_the_local_runs_with_their_runs(
    console: test_utils.TestClient,
) -> None:
    answer = await console.get("/flows")
    page = await answer.text()
    assert answer.status == 200, page
    assert "1 Flow(s) run in" in page
    assert '<span class="flow">gate</span>' in page and 'href="/local/gate-1"' in page


def _wait_for_file(path: Path, seconds: float = 60) -> None:
    """Until the tool wrote ``path`` (it has started)."""
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} was never written"
        time.sleep(0.05)


@pytest.fixture
def running_run(
    tmp_path: Path, tool_dir: Path
) -> Iterator[tuple[Path, Path, subprocess.Popen[str]]]:
    """``agentflows run`` of a flow held in a python tool: (state dir, counter, process)."""
    # Where the contained tool (its own uid when the tests run as root) may read and write.
    release, counter = tool_dir / "release", tool_dir / "counter"
    flow = tmp_path / "held.yaml"
    flow.write_text(
        COUNTED_HOLD_FLOW.replace("RELEASE", json.dumps(str(release))).replace(
            "COUNTER", json.dumps(str(counter))
        )
    )
    state = tmp_path / "runs"
    running = subprocess.Popen(
        [AGENTFLOWS, "run", str(flow), "--name", "held-1", "--state-dir", str(state), "-q"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env={**os.environ}, start_new_session=True,
    )  # fmt: skip
    try:
        _wait_for_node(state / "held-1.json", "hold", "Running")
        _wait_for_file(counter)
        yield state, counter, running
        release.write_text("go")
        _, err = running.communicate(timeout=120)
        assert running.returncode == 0, err
    finally:
        if running.poll() is None:
            running.kill()
            running.wait()


async def test_resuming_from_the_page_a_run_another_process_runs_is_409_and_runs_nothing(
    running_run: tuple[Path, Path, subprocess.Popen[str]],
) -> None:
    state, counter, running = running_run
    runs = console_command._local_runs(str(state))
    async with test_utils.TestClient(test_utils.TestServer(app.local_app(runs))) as client:
        page = await (await client.get("/local/held-1")).text()
        answer = await client.post("/local/held-1/resume", data={"csrf": _csrf(page)})
        text = await answer.text()
    assert answer.status == 409, text
    assert f"run held-1 is being run by another process: pid {running.pid}" in text
    assert not (state / "held-1.console.log").exists()  # no agentflows resume was started
    assert counter.read_text() == "started\n"


@asynccontextmanager
async def cluster_console(**gate_options: Any) -> AsyncIterator[test_utils.TestClient]:
    """A cluster console whose API server does not listen: a 502 would mean it was called."""
    api = kube.Client(kubeconfig.Config(server="https://127.0.0.1:9"), retry_seconds=0)
    gate = identity.Gate(api, **gate_options)
    server = test_utils.TestServer(app.cluster_app(gate, "default"))
    async with test_utils.TestClient(server) as client:
        yield client


async def test_a_cluster_console_acting_as_your_kubeconfig_user_answers_no_other_host() -> None:
    async with cluster_console() as console:
        port = _port(console)
        answer = await console.get("/runs", headers={"Host": f"rebind.example:{port}"})
        assert answer.status == 421 and 'name="csrf"' not in await answer.text()


@pytest.mark.parametrize(
    "path",
    ["/runs/ns/..%2fother", "/runs/..%2fkube-system/run", "/runs/ns/Run.X/graph.svg",
     "/events/run/ns/..%2f..%2fx"],
)  # fmt: skip
async def test_a_cluster_route_naming_a_path_is_404_before_any_api_call(path: str) -> None:
    proxy = {"trusted_proxy": ipaddress.ip_network("127.0.0.1/32")}
    async with cluster_console(**proxy) as console:
        headers = {"X-Forwarded-User": "alice"}
        answer = await console.get(yarl.URL(path, encoded=True), headers=headers)
        assert answer.status == 404, await answer.text()
        assert "is not a valid name" in await answer.text()
        token_page = await console.post(
            yarl.URL(path + "/cancel", encoded=True), data={"csrf": "x"}, headers=headers
        )
        assert token_page.status in (404, 405)

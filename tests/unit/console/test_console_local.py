"""``agentflows console --local``: the runs of a state directory, shown and resumed from the page.

A real local run (``agentflows run``, a subprocess) waits at an approval; the console app is
served on loopback and driven over real HTTP, as a browser would: reading pages, posting the
decision form with its CSRF token. Resuming runs the real ``agentflows resume``.
"""

from __future__ import annotations

import asyncio
import html
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import test_utils

from agentflows.cli import console_command, local_runs
from agentflows.console import app

AGENTFLOWS = str(Path(sys.executable).parent / "agentflows")
SCRIPT = "<script>alert('owned')</script>"

FLOW = {
    "apiVersion": "agentflows.io/v1alpha1",
    "kind": "Flow",
    "metadata": {"name": "gate"},
    "spec": {
        "input": {"type": "object", "properties": {"what": {"type": "string"}}},
        "nodes": [
            {"id": "write", "transform": '={text: "' + SCRIPT.replace("'", "\\u0027") + '"}'},
            {"id": "review", "approval": {"message": "Ship {{ .run.input.what }}?"}},
            {"id": "done", "transform": "={decision: .nodes.review.json.decision}"},
        ],
        "output": "=.nodes.done.json",
    },
}


@pytest.fixture
def waiting_run(tmp_path: Path) -> Path:
    """A local run of FLOW waiting at ``review``; the state directory."""
    (tmp_path / "flow.yaml").write_text(yaml.safe_dump(FLOW))
    state = tmp_path / "runs"
    done = subprocess.run(
        [AGENTFLOWS, "run", "flow.yaml", "--name", "gate-1", "--state-dir", str(state),
         "--input", "what=<b>v1</b>", "-q"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
        env={**os.environ},
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    return state


@pytest.fixture
async def console(waiting_run: Path) -> AsyncIterator[test_utils.TestClient]:
    """The --local console of that state directory, on a loopback port."""
    runs = console_command._local_runs(str(waiting_run))
    async with test_utils.TestClient(test_utils.TestServer(app.local_app(runs))) as client:
        yield client


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found, page
    return found.group(1)


async def test_local_runs_list_shows_the_waiting_run_with_its_pending_request(
    console: test_utils.TestClient,
) -> None:
    answer = await console.get("/runs")
    page = await answer.text()
    assert answer.status == 200
    assert 'href="/local/gate-1"' in page
    assert 'class="phase phase-Waiting">Waiting<' in page
    assert '<td data-field="pending">1</td>' in page


async def test_a_script_in_a_node_output_is_shown_as_text_never_as_markup(
    console: test_utils.TestClient,
) -> None:
    page = await (await console.get("/local/gate-1")).text()
    assert "&lt;script&gt;alert(" in page
    assert "<script>alert(" not in page
    assert "&lt;b&gt;v1&lt;/b&gt;" in page  # the input, and the message made from it


async def test_every_page_forbids_inline_script_and_foreign_assets(
    console: test_utils.TestClient,
) -> None:
    answer = await console.get("/local/gate-1")
    policy = answer.headers["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy
    assert "'unsafe-inline'" not in policy
    script = await console.get("/static/console.js")
    assert script.status == 200 and ".innerHTML" not in await script.text()


async def test_a_decision_without_the_pages_csrf_token_is_refused_and_nothing_is_decided(
    console: test_utils.TestClient, waiting_run: Path
) -> None:
    answer = await console.post(
        "/local/gate-1/requests/review", data={"decision": "approve", "csrf": "0" * 64}
    )
    assert answer.status == 403
    assert "reload the page" in await answer.text()
    run = local_runs.read(waiting_run, "gate-1")
    assert run is not None and run["status"]["phase"] == "Waiting"


async def test_approving_from_the_page_resumes_the_local_run_to_its_end(
    console: test_utils.TestClient, waiting_run: Path
) -> None:
    token = _csrf(await (await console.get("/local/gate-1")).text())
    answer = await console.post(
        "/local/gate-1/requests/review",
        data={"decision": "approve", "comment": "fine", "csrf": token},
        allow_redirects=False,
    )
    assert answer.status == 303 and answer.headers["Location"] == "/local/gate-1"
    for _ in range(600):
        run = local_runs.read(waiting_run, "gate-1")
        assert run is not None
        if run["status"]["phase"] not in ("Waiting", "Running", "Pending"):
            break
        await asyncio.sleep(0.1)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert run["status"]["output"] == {"decision": "approve"}
    assert run["status"]["requests"]["review"]["comment"] == "fine"
    page = await (await console.get("/local/gate-1")).text()
    assert 'class="phase phase-Succeeded">Succeeded<' in page


ASK = {
    "apiVersion": "agentflows.io/v1alpha1",
    "kind": "Flow",
    "metadata": {"name": "ask"},
    "spec": {
        "nodes": [
            {
                "id": "ask",
                "input": {
                    "message": "How many?",
                    "schema": {
                        "type": "object",
                        "properties": {"count": {"type": "integer", "minimum": 1}},
                        "required": ["count"],
                    },
                },
            },
            {"id": "use", "transform": "={double: (.nodes.ask.json.count * 2)}"},
        ],
        "output": "=.nodes.use.json",
    },
}


@pytest.fixture
def asking_run(tmp_path: Path) -> Path:
    """A local run of ASK waiting for its input; the state directory."""
    (tmp_path / "ask.yaml").write_text(yaml.safe_dump(ASK))
    state = tmp_path / "runs"
    done = subprocess.run(
        [AGENTFLOWS, "run", "ask.yaml", "--name", "ask-1", "--state-dir", str(state), "-q"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    return state


async def test_an_answer_form_is_generated_from_the_schema_and_checked_against_it(
    asking_run: Path,
) -> None:
    state = asking_run
    runs = console_command._local_runs(str(state))
    async with test_utils.TestClient(test_utils.TestServer(app.local_app(runs))) as console:
        page = await (await console.get("/local/ask-1")).text()
        assert '<input type="number" name="field.count" value="" step="1">' in page
        form = {"decision": "respond", "field.count": "0", "csrf": _csrf(page)}
        refused = await console.post("/local/ask-1/requests/ask", data=form)
        assert refused.status == 400
        text = html.unescape(await refused.text())
        assert "data['count'] does not match the request's schema: 0 is less than" in text
        form["field.count"] = "21"
        answer = await console.post("/local/ask-1/requests/ask", data=form, allow_redirects=False)
        assert answer.status == 303
        for _ in range(600):
            run = local_runs.read(state, "ask-1")
            assert run is not None
            if run["status"]["phase"] not in ("Waiting", "Running", "Pending"):
                break
            await asyncio.sleep(0.1)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert run["status"]["output"] == {"double": 42}


@pytest.fixture
def interrupted_run(tmp_path: Path) -> Path:
    """A local run stopped part-way (as Ctrl-C leaves it); the state directory."""
    flow = {**ASK, "spec": {"nodes": [{"id": "use", "transform": "={done: true}"}]}}
    (tmp_path / "once.yaml").write_text(yaml.safe_dump(flow))
    state = tmp_path / "runs"
    done = subprocess.run(
        [AGENTFLOWS, "run", "once.yaml", "--name", "once-1", "--state-dir", str(state), "-q"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    local_runs.save_interrupted(state, "once-1")
    return state


async def test_a_run_stopped_part_way_is_resumed_from_its_page(interrupted_run: Path) -> None:
    runs = console_command._local_runs(str(interrupted_run))
    async with test_utils.TestClient(test_utils.TestServer(app.local_app(runs))) as console:
        page = await (await console.get("/local/once-1")).text()
        assert 'class="phase phase-Pending">Pending<' in page
        assert 'action="/local/once-1/resume"' in page
        answer = await console.post(
            "/local/once-1/resume", data={"csrf": _csrf(page)}, allow_redirects=False
        )
        assert answer.status == 303
        for _ in range(600):
            run = local_runs.read(interrupted_run, "once-1")
            assert run is not None
            if run["status"]["phase"] == "Succeeded":
                break
            await asyncio.sleep(0.1)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert run["status"]["output"] == {"done": True}


async def test_each_nodes_input_is_shown_as_the_outputs_of_the_nodes_it_reads(
    console: test_utils.TestClient,
) -> None:
    page = await (await console.get("/local/gate-1")).text()
    review = page[page.index('<section class="node" data-node="review">') :]
    review = review[: review.index("</section>")]
    assert "no evaluated input is recorded: these are the outputs of the nodes it reads" in review
    assert "output of write (.nodes.write)" in review
    assert "&lt;script&gt;alert(" in review and "<script>alert(" not in review
    first = page[page.index('<section class="node" data-node="write">') :]
    assert "the run&#x27;s input (.run.input)" in first[: first.index("</section>")]


async def test_a_local_run_page_shows_the_runs_graph_drawn_from_its_snapshot(
    console: test_utils.TestClient,
) -> None:
    page = await (await console.get("/local/gate-1")).text()
    assert '<img src="/local/gate-1/graph.svg"' in page
    picture = await console.get("/local/gate-1/graph.svg")
    assert picture.status == 200 and picture.content_type == "image/svg+xml"
    drawn = await picture.text()
    assert "<svg" in drawn and "review" in drawn and "<script" not in drawn


async def _next_event(stream: Any) -> dict[str, Any]:
    while True:
        line = (await stream.content.readline()).decode()
        if line.startswith("data: "):
            found: dict[str, Any] = json.loads(line[len("data: ") :])
            return found


async def test_a_local_run_page_follows_the_run_as_its_state_file_changes(
    console: test_utils.TestClient,
) -> None:
    page = await (await console.get("/local/gate-1")).text()
    assert 'data-live="/events/local/gate-1"' in page
    stream = await console.get("/events/local/gate-1")
    assert stream.headers["Content-Type"] == "text/event-stream"
    first = await _next_event(stream)
    assert first["phase"] == "Waiting" and first["nodes"]["review"]["phase"] == "Waiting"
    form = {"decision": "approve", "csrf": _csrf(page)}
    await console.post("/local/gate-1/requests/review", data=form, allow_redirects=False)
    seen = first
    while seen["phase"] in ("Waiting", "Running", "Pending"):
        seen = await asyncio.wait_for(_next_event(stream), 120)
    assert seen["phase"] == "Succeeded"
    assert seen["nodes"]["done"]["phase"] == "Succeeded"
    stream.close()


DELETE = {
    "apiVersion": "agentflows.io/v1alpha1",
    "kind": "Flow",
    "metadata": {"name": "clean"},
    "spec": {
        "autonomy": "supervised",
        "nodes": [
            {
                "id": "delete",
                "tool": {
                    "python": {
                        "script": "import json, sys\nprint(json.dumps(json.load(sys.stdin)))"
                    },
                    "args": {"path": "/tmp/x"},
                },
            }
        ],
    },
}


@pytest.fixture
def tool_waiting_run(tmp_path: Path) -> Path:
    """A local run of DELETE waiting for approval of its tool call; the state directory."""
    (tmp_path / "clean.yaml").write_text(yaml.safe_dump(DELETE))
    state = tmp_path / "runs"
    done = subprocess.run(
        [AGENTFLOWS, "run", "clean.yaml", "--name", "clean-1", "--state-dir", str(state), "-q"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    return state


async def test_an_edit_that_is_not_the_calls_arguments_is_refused_on_the_page_and_nothing_runs(
    tool_waiting_run: Path,
) -> None:
    state = tool_waiting_run
    runs = console_command._local_runs(str(state))
    async with test_utils.TestClient(test_utils.TestServer(app.local_app(runs))) as console:
        page = await (await console.get("/local/clean-1")).text()
        assert 'name="edits"' in page
        form = {"decision": "edit", "edits": '"/tmp/y"', "csrf": _csrf(page)}
        refused = await console.post("/local/clean-1/requests/delete", data=form)
        assert refused.status == 400
        assert "edits: the call&#x27;s arguments are a JSON object" in await refused.text()
    run = local_runs.read(state, "clean-1")
    assert run is not None and run["status"]["phase"] == "Waiting"
    assert "decision" not in run["status"]["requests"]["delete"]
    assert not (state / "clean-1.console.log").exists()  # no resume was started

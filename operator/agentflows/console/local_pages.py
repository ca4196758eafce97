"""``agentflows console --local``: the runs of a local state directory, resumed from the page.

No API server here: the CLI hands the console a :class:`LocalRuns` (how to read the state
directory, and the ``agentflows resume`` command line), so a run read on the page is exactly
what ``agentflows get`` shows. Resuming runs ``agentflows resume RUN`` (with the decision, when
one is given) as a child process that outlives the request, writing its progress to
``<run>.console.log`` beside the run; the page shows the run's saved state, so a reload shows
how far it got. The console listens on loopback: whoever reaches it is the local user.

A run's page follows the run live: :class:`Watches` keeps one poller per run (not per page)
that looks at the run's checkpoint file's modification time once a second and, when it
changed, reads the run and sends its node phases to every page open on it over SSE.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pydantic
from aiohttp import web

from agentflows import diagram
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.api import requests as human_requests
from agentflows.console import forms, live, markup, pages_requests, run_detail, runs_view, site

#: Phases from which a local run can go on (waiting for a decision, or stopped part-way).
RESUMABLE = frozenset(p.value for p in flowrun_api.RunPhase if not p.terminal)


@dataclasses.dataclass
class LocalRuns:
    """What the CLI gives the console to show local runs."""

    directory: Path
    #: Every run as a FlowRun object, and why unreadable ones were skipped.
    read_all: Callable[[], tuple[list[dict[str, Any]], list[str]]]
    #: One run as a FlowRun object (None: no such run).
    read: Callable[[str], dict[str, Any] | None]
    #: The command line of ``agentflows resume`` without the run's arguments.
    resume_command: list[str]
    #: Who decides, as ``agentflows resume --by`` records it.
    decided_by: str
    #: The Flow specs a run started with, by name.
    flows: Callable[[str], dict[str, Any]]
    #: When a run's checkpoint file last changed (None: not written yet).
    changed_at: Callable[[str], int | None]
    #: Why a name is not a run name (None when it is): checked on every route.
    name_problem: Callable[[str], str | None]
    #: Which process owns the run now, in words (None: none; ``agentflows resume`` may start).
    owner: Callable[[str], str | None]


#: Seconds between two looks at a followed run's checkpoint file.
POLL_SECONDS = 1.0


@dataclasses.dataclass
class _Watch:
    queues: set[asyncio.Queue[live.Change]] = dataclasses.field(default_factory=set)
    task: asyncio.Task[None] | None = None


class Watches:
    """One poller per followed run, shared by every page open on it."""

    def __init__(self, runs: LocalRuns) -> None:
        self.runs = runs
        self.watches: dict[str, _Watch] = {}

    @contextlib.asynccontextmanager
    async def subscribe(self, name: str) -> AsyncIterator[asyncio.Queue[live.Change]]:
        """A queue of the run as it changes; the poller stops with its last subscriber."""
        watch = self.watches.get(name)
        if watch is None:
            watch = self.watches[name] = _Watch()
            watch.task = asyncio.create_task(self._poll(name, watch))
        queue: asyncio.Queue[live.Change] = asyncio.Queue()
        watch.queues.add(queue)
        try:
            yield queue
        finally:
            watch.queues.discard(queue)
            if not watch.queues and self.watches.get(name) is watch:
                del self.watches[name]
                if watch.task is not None:
                    watch.task.cancel()

    async def _poll(self, name: str, watch: _Watch) -> None:
        seen: int | None = -1
        while True:
            changed = self.runs.changed_at(name)
            if changed != seen:
                seen = changed
                run = await asyncio.to_thread(self.runs.read, name)
                if run is not None:
                    for queue in watch.queues:
                        queue.put_nowait(("upsert", run))
            await asyncio.sleep(POLL_SECONDS)

    async def close(self) -> None:
        """Stop every poller (the server is stopping)."""
        for watch in self.watches.values():
            if watch.task is not None:
                watch.task.cancel()
        self.watches.clear()


KEY = web.AppKey("local-runs", LocalRuns)
WATCHES = web.AppKey("local-watches", Watches)


def _runs(request: web.Request) -> LocalRuns:
    return request.app[KEY]


async def runs_page(request: web.Request) -> web.Response:
    """GET /runs: the local runs, newest first."""
    local = _runs(request)
    runs, problems = local.read_all()
    notes = [markup.notice(p, error=True) for p in problems]
    where = markup.tag("p", f"{len(runs)} run(s) in {local.directory}", class_="muted", id="count")
    return site.page(request, "Runs", markup.join([*notes, where, runs_view.runs_table(runs)]))


async def requests_page(request: web.Request) -> web.Response:
    """GET /requests: every pending request of the local runs, each with its decision form."""
    local = _runs(request)
    runs, problems = local.read_all()
    token = site.csrf(request)
    cards = [
        pages_requests.card(run, rid, r, token, action=markup.path("local", name, "requests", rid))
        for run in sorted(runs, key=runs_view.key)
        for name in [run["metadata"]["name"]]
        for rid, r in sorted(runs_view.pending(run).items())
    ]
    count = f"{len(cards)} pending request(s) in {local.directory}"
    parts = [markup.notice(p, error=True) for p in problems]
    parts += [markup.tag("p", count, class_="muted", id="count"), *cards]
    return site.page(request, "Requests", markup.join(parts))


async def flows_page(request: web.Request) -> web.Response:
    """GET /flows: the Flows the local runs started with (from their snapshots), and their runs.

    A local Flow lives in a file, not here: a row shows the definition each run kept, with
    the runs that started from it.
    """
    local = _runs(request)
    runs, problems = local.read_all()
    used: dict[str, list[dict[str, Any]]] = {}
    nodes: dict[str, int] = {}
    for run in sorted(runs, key=runs_view.key):
        flow = str((run.get("spec") or {}).get("flow"))
        used.setdefault(flow, []).append(run)
        spec = local.flows(run["metadata"]["name"]).get(flow) or {}
        nodes.setdefault(flow, len(spec.get("nodes") or []))
    rows = [
        (
            markup.tag("span", flow, class_="flow"),
            str(nodes[flow]),
            markup.join(
                part
                for r in flow_runs
                for part in (markup.link(runs_view.href(r), r["metadata"]["name"]), " ")
            ),
        )
        for flow, flow_runs in sorted(used.items())
    ]
    count = f"{len(rows)} Flow(s) run in {local.directory}"
    parts = [markup.notice(p, error=True) for p in problems]
    parts += [markup.tag("p", count, class_="muted", id="count")]
    parts += [markup.table(["Flow", "Nodes", "Runs"], rows, id="flows")]
    return site.page(request, "Flows", markup.join(parts))


def _run_or_404(request: web.Request) -> dict[str, Any]:
    name = request.match_info["name"]
    run = _runs(request).read(name)
    if run is None:
        raise web.HTTPNotFound(text=f"no local run {name}")
    return run


async def run_page(request: web.Request) -> web.Response:
    """GET /local/NAME: a local run, with its pending requests and a Resume button."""
    run = _run_or_404(request)
    name = run["metadata"]["name"]
    token = site.csrf(request)
    status = flowrun_api.status_of(run)
    pending = human_requests.decidable(status)
    cards = [
        pages_requests.card(run, rid, r, token, action=markup.path("local", name, "requests", rid))
        for rid, r in sorted(pending.items())
    ]
    actions: Any = ""
    if (status.phase or flowrun_api.RunPhase.PENDING) in RESUMABLE and not pending:
        actions = markup.button_form(markup.path("local", name, "resume"), "Resume", token)
    flow_spec = _runs(request).flows(name).get(str((run.get("spec") or {}).get("flow")))
    src = markup.path("local", name, "graph.svg")
    picture = markup.void("img", src=src, alt=f"graph of {name}", id="picture", class_="picture")
    body = markup.join(
        [
            markup.tag("div", actions, class_="actions"),
            markup.tag(
                "div",
                markup.join([picture if flow_spec else "", run_detail.summary(run, status)]),
                class_="overview",
            ),
            markup.tag("h2", "Graph"),
            run_detail.graph(run, flow_spec, status),
            markup.tag("h2", "Requests"),
            markup.join(cards) if cards else markup.tag("p", "none pending", class_="muted"),
            markup.tag("h2", "Nodes"),
            run_detail.nodes(run, flow_spec, lambda node: None, status),
        ]
    )
    return site.page(request, name, body, live_path=markup.path("events", "local", name))


async def graph_svg(request: web.Request) -> web.Response:
    """GET /local/NAME/graph.svg: the run drawn by Graphviz from its snapshot, by node phase."""
    run = _run_or_404(request)
    name = run["metadata"]["name"]
    try:
        specs = {
            n: flow_api.FlowSpec.model_validate(s) for n, s in _runs(request).flows(name).items()
        }
        spec = specs[str((run.get("spec") or {}).get("flow"))]
        drawn = diagram.svg(spec, flowrun_api.status_of(run).nodes, flows=specs)
    except (KeyError, pydantic.ValidationError):
        raise web.HTTPNotFound(text=f"no Flow to draw {name} with") from None
    except diagram.GraphvizMissing as exc:
        raise web.HTTPServiceUnavailable(text=str(exc)) from None
    return web.Response(text=drawn, content_type="image/svg+xml")


async def run_events(request: web.Request) -> web.StreamResponse:
    """GET /events/local/NAME: the run's phase and node phases as its file changes (SSE)."""
    name = _run_or_404(request)["metadata"]["name"]

    def message(kind: str, run: dict[str, Any]) -> dict[str, Any] | None:
        return runs_view.node_phases(run) if kind == "upsert" else None

    async with request.app[WATCHES].subscribe(name) as changes:
        return await live.stream(request, changes, message)


def _resume(local: LocalRuns, name: str, values: dict[str, Any], rid: str | None) -> None:
    """Start ``agentflows resume`` for run ``name`` in the background (409 when it is running).

    The child takes the run's lock itself (:mod:`agentflows.cli.run_lock`), so of two posts
    that pass this check at once, one resumes and the other's child exits 2 into the log.
    """
    owner = local.owner(name)
    if owner is not None:
        raise web.HTTPConflict(text=owner)
    argv = [*local.resume_command, name, "--state-dir", str(local.directory), "-q"]
    if rid is not None:
        argv += ["--request", rid, "--decision", values["decision"], "--by", local.decided_by]
        for option in ("data", "edits"):
            if option in values:
                argv += [f"--{option}", json.dumps(values[option])]
        if values.get("comment"):
            argv += ["--comment", values["comment"]]
    log = (local.directory / f"{name}.console.log").open("ab")
    with log:
        subprocess.Popen(
            argv,
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            env=os.environ.copy(),
            start_new_session=True,
        )


async def resume(request: web.Request) -> web.StreamResponse:
    """POST /local/NAME/resume: go on with a run stopped part-way."""
    await site.check_csrf(request)
    run = _run_or_404(request)
    _resume(_runs(request), run["metadata"]["name"], {}, None)
    raise web.HTTPSeeOther(markup.path("local", run["metadata"]["name"]))


async def decide(request: web.Request) -> web.StreamResponse:
    """POST /local/NAME/requests/ID: decide a pending request and resume the run."""
    fields = await site.check_csrf(request)
    run = _run_or_404(request)
    name, rid = run["metadata"]["name"], request.match_info["rid"]
    pending = runs_view.pending(run).get(rid)
    if pending is None:
        raise web.HTTPConflict(text=f"request {rid} of {name} is not pending any more")
    try:
        values = pages_requests.decision_values(pending, fields)
    except forms.FormError as exc:
        action = markup.path("local", name, "requests", rid)
        shown = pages_requests.card(
            run, rid, pending, site.csrf(request), action=action, values=fields, problem=str(exc)
        )
        return site.page(request, name, shown, status=400)
    _resume(_runs(request), name, values, rid)
    raise web.HTTPSeeOther(markup.path("local", name))

"""``agentflows console --local``: the runs of a local state directory, resumed from the page.

No API server here: the CLI hands the console a :class:`LocalRuns` (how to read the state
directory, and the ``agentflows resume`` command line), so a run read on the page is exactly
what ``agentflows get`` shows. Resuming runs ``agentflows resume RUN`` (with the decision, when
one is given) as a child process that outlives the request, writing its progress to
``<run>.console.log`` beside the run; the page shows the run's saved state, so a reload shows
how far it got. The console listens on loopback: whoever reaches it is the local user.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from agentflows.console import forms, markup, pages_requests, run_detail, runs_view, site

#: Phases from which a local run can go on (waiting for a decision, or stopped part-way).
RESUMABLE = frozenset({"Waiting", "Pending", "Running"})


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


KEY = web.AppKey("local-runs", LocalRuns)


def _runs(request: web.Request) -> LocalRuns:
    return request.app[KEY]


async def runs_page(request: web.Request) -> web.Response:
    """GET /runs: the local runs, newest first."""
    local = _runs(request)
    runs, problems = local.read_all()
    notes = [markup.notice(p, error=True) for p in problems]
    where = markup.tag("p", f"{len(runs)} run(s) in {local.directory}", class_="muted", id="count")
    return site.page(request, "Runs", markup.join([*notes, where, runs_view.runs_table(runs)]))


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
    pending = runs_view.pending(run)
    cards = [
        pages_requests.card(run, rid, r, token, action=markup.path("local", name, "requests", rid))
        for rid, r in sorted(pending.items())
    ]
    phase = (run.get("status") or {}).get("phase") or "Pending"
    actions: Any = ""
    if phase in RESUMABLE and not pending:
        actions = markup.button_form(markup.path("local", name, "resume"), "Resume", token)
    body = markup.join(
        [
            markup.tag("div", actions, class_="actions"),
            run_detail.summary(run),
            markup.tag("h2", "Graph"),
            run_detail.graph(run, None),
            markup.tag("h2", "Requests"),
            markup.join(cards) if cards else markup.tag("p", "none pending", class_="muted"),
            markup.tag("h2", "Nodes"),
            run_detail.nodes(run, None, lambda node: None),
        ]
    )
    return site.page(request, name, body)


def _resume(local: LocalRuns, name: str, values: dict[str, Any], rid: str | None) -> None:
    """Start ``agentflows resume`` for run ``name`` in the background."""
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

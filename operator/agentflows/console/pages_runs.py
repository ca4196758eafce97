"""The runs list and a run's page: nodes, requests, pod log, Events; cancel and re-run.

Every read and write is made as the caller (:func:`site.caller`). The list is rendered once on
the server and then follows the feed of its filter (:mod:`.live`); with no namespace chosen, it
shows the namespaces the caller may list (:mod:`.scope`), one shared feed per namespace; a run's
page follows a feed of that one run, so node phases change on the page as the runner writes them.
While a run goes on, its page also shows agents' answers as the model writes them
(:func:`run_text_events`): the runner pod's log followed as the caller, one follower per open
page (the text is not shared: each page reads from the log's start, under its own RBAC).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib import parse

import pydantic
from aiohttp import web

from agentflows import diagram
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.api import requests as human_requests
from agentflows.console import live, markup, pages_requests, run_detail, runs_view, scope, site
from agentflows.kube import actions, snapshot, status_store
from agentflows.kube import client as kube
from agentflows.runner import stream_log

#: Lines of the runner pod's log shown on a run's page.
LOG_LINES = 400
PHASES = ("", *(p.value for p in flowrun_api.RunPhase))
TRIGGERS = ("", "manual", "schedule", "webhook", "kubernetes")


def filters(request: web.Request) -> dict[str, str]:
    """The list's filters from the query (no ``namespace`` parameter: the default one)."""
    query = request.query
    namespace = query.get("namespace", site.of(request).namespace).strip()
    return {
        "namespace": namespace,
        "flow": query.get("flow", "").strip(),
        "phase": query.get("phase", "").strip(),
        "trigger": query.get("trigger", "").strip(),
    }


def _selector(flow: str) -> str | None:
    # spec.flow is a selectable field of the CRD: the API server filters
    return f"spec.flow={flow}" if flow else None


def _filter_form(chosen: dict[str, str]) -> markup.Html:
    def select(name: str, options: tuple[str, ...]) -> markup.Html:
        items = [
            markup.tag("option", o or "any", value=o, selected=o == chosen[name]) for o in options
        ]
        return markup.tag(
            "label", markup.join([name, markup.tag("select", markup.join(items), name=name)])
        )

    def box(name: str, hint: str) -> markup.Html:
        field = markup.void("input", name=name, value=chosen[name], placeholder=hint)
        return markup.tag("label", markup.join([name, field]))

    parts = [
        box("namespace", "all namespaces"),
        box("flow", "any flow"),
        select("phase", PHASES),
        select("trigger", TRIGGERS),
        markup.tag("button", "Filter", type="submit"),
    ]
    return markup.tag("form", markup.join(parts), method="get", action="/runs", class_="filters")


async def runs_page(request: web.Request) -> web.Response:
    """GET /runs: FlowRuns by namespace, flow, phase and trigger, following a live feed."""
    chosen = filters(request)
    selector = _selector(chosen["flow"])
    params = {"fieldSelector": selector} if selector else {}
    async with site.api(request) as api:
        namespaces = await scope.chosen(api, site.of(request).namespaces, chosen["namespace"])
        found = await scope.list_runs(api, namespaces, **params)
    runs = [r for r in found if runs_view.matches(r, chosen["phase"], chosen["trigger"])]
    count = markup.tag("p", f"{len(runs)} run(s)", id="count", class_="muted")
    where = ""
    if namespaces is not None and not chosen["namespace"]:
        shown = f"in the namespaces you may list: {', '.join(namespaces)}"
        where = markup.tag("p", shown, id="scope", class_="muted")
    body = markup.join([_filter_form(chosen), where, count, runs_view.runs_table(runs)])
    # every filter, empty ones too: an empty namespace means all, not the default one
    live_path = "/events/runs?" + parse.urlencode(chosen)
    return site.page(request, "Runs", body, live_path=live_path)


async def runs_events(request: web.Request) -> web.StreamResponse:
    """GET /events/runs: the list's rows as they change (SSE)."""
    chosen = filters(request)

    def message(kind: str, run: dict[str, Any]) -> dict[str, Any]:
        if kind == "delete" or not runs_view.matches(run, chosen["phase"], chosen["trigger"]):
            return {"type": "delete", "key": runs_view.key(run)}
        return {"type": "upsert", "row": runs_view.row(run)}

    hub = site.hub(request)
    selector = _selector(chosen["flow"])
    async with site.api(request) as api:
        namespaces = await scope.chosen(api, site.of(request).namespaces, chosen["namespace"])
    if namespaces is None:
        following = hub.subscribe(site.caller(request), None, selector)
    else:
        following = hub.subscribe_all(site.caller(request), namespaces, selector)
    async with following as changes:
        return await live.stream(request, changes, message)


async def run_events(request: web.Request) -> web.StreamResponse:
    """GET /events/run/NS/NAME: the run's phase and node phases as they change (SSE)."""
    namespace, name = request.match_info["namespace"], request.match_info["name"]

    def message(kind: str, run: dict[str, Any]) -> dict[str, Any] | None:
        return runs_view.node_phases(run) if kind == "upsert" else None

    hub = site.hub(request)
    async with hub.subscribe(site.caller(request), namespace, f"metadata.name={name}") as changes:
        return await live.stream(request, changes, message)


async def run_text_events(request: web.Request) -> web.StreamResponse:
    """GET /events/run/NS/NAME/text: agents' answers as they are written (SSE), then ``end``.

    Each event is ``{"type": "text", "node", "delta"}`` (or ``restart``/``end`` for a node),
    read from the run's runner pods' logs as the caller; a refusal (no ``pods/log`` get) is an
    ``error`` event with the API server's words.
    """
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    changes: asyncio.Queue[live.Change] = asyncio.Queue()

    async def follow() -> None:
        try:
            async with site.api(request) as api:
                async for event in stream_log.follow_run(api, namespace, name):
                    changes.put_nowait(("text", event))
        except kube.ApiError as exc:
            changes.put_nowait(("error", exc.message or str(exc)))
            return
        changes.put_nowait((live.END, None))

    def message(kind: str, event: dict[str, Any] | None) -> dict[str, Any]:
        return {"type": "text", **event} if event is not None else {"type": live.END}

    following = asyncio.create_task(follow())
    try:
        return await live.stream(request, changes, message)
    finally:
        following.cancel()


def _live_text(namespace: str, name: str, status: flowrun_api.FlowRunStatus) -> markup.Html:
    """Where the page's script writes answers as they are written (only while the run goes on)."""
    if status.phase in stream_log.SETTLED:
        return markup.Html("")
    idle = markup.tag("p", "no answer is being written", class_="muted")
    return markup.tag(
        "section",
        markup.join([markup.tag("h2", "Being written"), idle]),
        id="live-text",
        data_live_text=markup.path("events", "run", namespace, name, "text"),
    )


async def _flows(api: kube.Client, namespace: str, run: dict[str, Any]) -> dict[str, Any]:
    """Flow specs by name as the run started them (its snapshot), else the run's Flow now."""
    flow = str((run.get("spec") or {}).get("flow") or "")
    try:
        found = await api.get(
            kube.path_of("configmaps", namespace, snapshot.snapshot_name(run["metadata"]["name"]))
        )
        taken = json.loads((found.get("data") or {}).get(snapshot.SNAPSHOT_KEY) or "{}")
        flows = taken.get("flows") or {}
        if isinstance(flows.get(flow), dict):
            return dict(flows)
    except (kube.ApiError, ValueError):
        pass  # a user may not read ConfigMaps: the Flow as it is now is the next best
    try:
        spec = (await api.get(kube.path_of("flows", namespace, flow))).get("spec")
    except kube.ApiError:
        return {}
    return {flow: spec} if isinstance(spec, dict) else {}


async def _log(api: kube.Client, namespace: str, status: flowrun_api.FlowRunStatus) -> markup.Html:
    pod = status.pod
    if not pod:
        return markup.tag("span", "no runner pod", class_="muted")
    try:
        text = await api.request_text(
            "GET", kube.path_of("pods", namespace, pod, sub="log"), tailLines=LOG_LINES
        )
    except kube.ApiError as exc:
        return markup.notice(f"log of {pod} unavailable: {exc.message or exc}")
    return markup.tag("pre", text or "(empty)", class_="log")


async def _events(api: kube.Client, namespace: str, name: str) -> markup.Html:
    selector = f"involvedObject.kind=FlowRun,involvedObject.name={name}"
    try:
        found = await api.get(kube.path_of("events", namespace), fieldSelector=selector)
    except kube.ApiError as exc:
        return markup.notice(f"events unavailable: {exc.message or exc}")
    return run_detail.events(found.get("items") or [])


def _requests(
    request: web.Request, run: dict[str, Any], status: flowrun_api.FlowRunStatus
) -> markup.Html:
    token = site.csrf(request)
    pending = human_requests.decidable(status)
    cards = [pages_requests.card(run, rid, r, token) for rid, r in sorted(pending.items())]
    return markup.join(cards) if cards else markup.tag("p", "none pending", class_="muted")


async def run_page(request: web.Request) -> web.Response:
    """GET /runs/NS/NAME: the run, following its feed."""
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    async with site.api(request) as api:
        run = await api.get(kube.path_of("flowruns", namespace, name))
        status = flowrun_api.status_of(run)
        flows = await _flows(api, namespace, run)
        log = await _log(api, namespace, status)
        events = await _events(api, namespace, name)
    token = site.csrf(request)
    buttons = markup.join(
        [
            markup.button_form(markup.path("runs", namespace, name, "cancel"), "Cancel", token),
            markup.button_form(markup.path("runs", namespace, name, "rerun"), "Re-run", token),
        ]
    )

    flow_spec = flows.get(str((run.get("spec") or {}).get("flow")))
    picture = markup.void(
        "img",
        src=markup.path("runs", namespace, name, "graph.svg"),
        alt=f"graph of {name}",
        id="picture",
        class_="picture",
    )

    def output_href(node: str) -> str:
        return markup.path("runs", namespace, name, "nodes", node, "output")

    body = markup.join(
        [
            markup.tag("div", buttons, class_="actions"),
            markup.tag(
                "div",
                markup.join([picture if flow_spec else "", run_detail.summary(run, status)]),
                class_="overview",
            ),
            markup.tag("h2", "Graph"),
            run_detail.graph(run, flow_spec, status),
            _live_text(namespace, name, status),
            markup.tag("h2", "Requests"),
            _requests(request, run, status),
            markup.tag("h2", "Nodes"),
            run_detail.nodes(run, flow_spec, output_href, status),
            markup.tag("h2", "Runner log"),
            log,
            markup.tag("h2", "Events"),
            events,
        ]
    )
    live_path = markup.path("events", "run", namespace, name)
    return site.page(request, f"{namespace}/{name}", body, live_path=live_path)


async def cancel(request: web.Request) -> web.StreamResponse:
    """POST /runs/NS/NAME/cancel: set ``spec.cancel`` (the operator stops the run)."""
    await site.check_csrf(request)
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    async with site.api(request) as api:
        await api.merge_patch(kube.path_of("flowruns", namespace, name), {"spec": {"cancel": True}})
    raise web.HTTPSeeOther(markup.path("runs", namespace, name))


async def rerun(request: web.Request) -> web.StreamResponse:
    """POST /runs/NS/NAME/rerun: a new manual run of the same Flow with the same input."""
    await site.check_csrf(request)
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    async with site.api(request) as api:
        run = await api.get(kube.path_of("flowruns", namespace, name))
        spec = run.get("spec") or {}
        created = await actions.start(api, namespace, str(spec.get("flow")), spec.get("input"))
    raise web.HTTPSeeOther(runs_view.href(created))


async def node_output(request: web.Request) -> web.Response:
    """GET /runs/NS/NAME/nodes/NODE/output: an offloaded output, read back on demand."""
    namespace, name, node = (request.match_info[k] for k in ("namespace", "name", "node"))
    async with site.api(request) as api:
        run = await api.get(kube.path_of("flowruns", namespace, name))
        record = flowrun_api.status_of(run).nodes.get(node)
        ref = record.output_ref if record else None
        try:
            value = await status_store.read_output(api, namespace, ref) if ref else None
        except status_store.OffloadError as exc:
            body = markup.notice(f"the output of {node} cannot be read: {exc}", error=True)
            return site.page(request, f"{name} · {node} output", body, status=404)
        value = value if ref or record is None else record.output
    body = markup.join(
        [
            markup.link(markup.path("runs", namespace, name), "Back to the run"),
            markup.json_block(value),
        ]
    )
    return site.page(request, f"{name} · {node} output", body)


async def graph_svg(request: web.Request) -> web.Response:
    """GET /runs/NS/NAME/graph.svg: the run drawn by Graphviz, nodes coloured by phase.

    Shown in an ``<img>`` (an SVG there never runs anything), fetched again by the script
    when a node's phase changes.
    """
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    async with site.api(request) as api:
        run = await api.get(kube.path_of("flowruns", namespace, name))
        flows = await _flows(api, namespace, run)
    try:
        specs = {n: flow_api.FlowSpec.model_validate(s) for n, s in flows.items()}
        spec = specs[str((run.get("spec") or {}).get("flow"))]
        drawn = diagram.svg(spec, flowrun_api.status_of(run).nodes, flows=specs)
    except (KeyError, pydantic.ValidationError):
        raise web.HTTPNotFound(text=f"no Flow to draw {name} with") from None
    except diagram.GraphvizMissing as exc:
        raise web.HTTPServiceUnavailable(text=str(exc)) from None
    return web.Response(text=drawn, content_type="image/svg+xml")

"""Flows: their Ready condition, triggers and recent runs, and a start form from the input schema.

The start form is generated from the Flow's ``spec.input`` (:mod:`.forms`); the submitted input
is checked against that schema on the server, and each problem is shown with its field path
(``input.count: 0 is less than the minimum of 1``) above the form, keeping what was typed. A
valid input starts a manual run, as ``agentflows start`` does, as the caller.
"""

from __future__ import annotations

import datetime
from typing import Any

from aiohttp import web

from agentflows.api import common, times
from agentflows.console import forms, markup, runs_view, scope, site
from agentflows.engine import run as run_mod
from agentflows.kube import actions
from agentflows.kube import client as kube
from agentflows.triggers import schedule as schedule_mod

#: Recent runs shown per Flow.
RECENT_RUNS = 5


def _ready(flow: dict[str, Any]) -> markup.Html:
    found = common.condition_of((flow.get("status") or {}).get("conditions"), "Ready")
    if found is None:
        return markup.tag("span", "unknown", class_="muted")
    css = "phase phase-Succeeded" if found.get("status") == "True" else "phase phase-Failed"
    label = "Ready" if found.get("status") == "True" else str(found.get("reason") or "Not ready")
    return markup.join([markup.tag("span", label, class_=css), " ", found.get("message") or ""])


def _schedule(schedule: dict[str, Any], now: datetime.datetime) -> str:
    cron, zone = str(schedule.get("cron", "")), schedule.get("timeZone")
    try:
        at = schedule_mod.next_time(cron, zone, now)
    except ValueError as exc:
        return f"schedule {cron} ({zone or 'UTC'}); next: unknown, {exc}"
    utc = at.astimezone(datetime.UTC).strftime("%H:%M UTC")
    return f"schedule {cron} ({zone or 'UTC'}); next: {at:%Y-%m-%d %H:%M %Z} ({utc})"


def triggers(flow: dict[str, Any], webhook_url: str, now: datetime.datetime) -> markup.Html:
    """The Flow's triggers: a schedule's next time, a webhook's URL (under ``webhook_url``)."""
    meta, rows = flow["metadata"], []
    for trigger in (flow.get("spec") or {}).get("triggers") or []:
        name = trigger.get("name", "")
        if "schedule" in trigger:
            what = _schedule(trigger["schedule"] or {}, now)
        elif "webhook" in trigger:
            hook = markup.path("hooks", meta.get("namespace") or "", meta["name"], name)
            what = f"webhook POST {webhook_url.rstrip('/')}{hook}"
        elif "kubernetes" in trigger:
            watched = trigger["kubernetes"] or {}
            what = f"kubernetes {watched.get('kind', '')} events"
        else:
            what = ""
        rows.append((name, what))
    if not rows:
        return markup.tag("span", "none (manual runs only)", class_="muted")
    return markup.table(("Trigger", "Fires on"), rows)


def _recent(runs: list[dict[str, Any]]) -> markup.Html:
    newest = sorted(runs, key=lambda r: runs_view.row(r)["started"], reverse=True)[:RECENT_RUNS]
    if not newest:
        return markup.tag("span", "no runs", class_="muted")
    items = [
        markup.tag(
            "li",
            markup.join(
                [
                    markup.link(runs_view.href(r), runs_view.row(r)["name"]),
                    " ",
                    markup.phase(runs_view.row(r)["phase"]),
                ]
            ),
        )
        for r in newest
    ]
    return markup.tag("ul", markup.join(items), class_="recent")


def start_form(
    flow: dict[str, Any], csrf: str, values: dict[str, str] | None = None
) -> markup.Html:
    """The form that starts a run, its fields generated from the Flow's input schema."""
    meta = flow["metadata"]
    schema = (flow.get("spec") or {}).get("input")
    parts = [
        markup.hidden("csrf", csrf),
        forms.fields(schema, values),
        markup.tag("button", "Start a run", type="submit", class_="start"),
    ]
    action = markup.path("flows", meta.get("namespace") or "", meta["name"], "start")
    return markup.tag(
        "form", markup.join(parts), method="post", action=action, novalidate=True, class_="start"
    )


def _flow_section(
    flow: dict[str, Any], runs: list[dict[str, Any]], csrf: str, webhook_url: str
) -> markup.Html:
    meta = flow["metadata"]
    facts = [
        ("Ready", _ready(flow)),
        ("Triggers", triggers(flow, webhook_url, times.now())),
        ("Recent runs", _recent(runs)),
        ("Input schema", markup.json_block((flow.get("spec") or {}).get("input"))),
        ("Start", start_form(flow, csrf)),
    ]
    items = markup.join(markup.join([markup.tag("dt", k), markup.tag("dd", v)]) for k, v in facts)
    title = markup.tag("h2", f"{meta.get('namespace')}/{meta['name']}")
    return markup.tag(
        "section",
        markup.join([title, markup.tag("dl", items, class_="facts")]),
        class_="flow",
        id=f"flow-{meta['name']}",
    )


async def flows_page(request: web.Request) -> web.Response:
    """GET /flows: every Flow of the namespace with its runs (two list calls, as the caller)."""
    namespace = request.query.get("namespace", site.of(request).namespace).strip()
    async with site.api(request) as api:
        namespaces = await scope.chosen(api, site.of(request).namespaces, namespace, "flows")
        flows = await scope.list_runs(api, namespaces, "flows")
        runs = await scope.list_runs(api, namespaces)
    by_flow: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        where = (str(run["metadata"].get("namespace")), str((run.get("spec") or {}).get("flow")))
        by_flow.setdefault(where, []).append(run)
    token, hooks = site.csrf(request), site.of(request).webhook_url
    sections = [
        _flow_section(
            f,
            by_flow.get((str(f["metadata"].get("namespace")), f["metadata"]["name"]), []),
            token,
            hooks,
        )
        for f in sorted(
            flows, key=lambda f: (f["metadata"].get("namespace"), f["metadata"]["name"])
        )
    ]
    count = markup.tag(
        "p",
        f"{len(flows)} flow(s) in "
        + (namespace or ", ".join(namespaces or []) or "all namespaces"),
        class_="muted",
    )
    return site.page(request, "Flows", markup.join([count, *sections]))


async def start(request: web.Request) -> web.StreamResponse:
    """POST /flows/NS/NAME/start: check the input against the schema, then start a run."""
    fields = await site.check_csrf(request)
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    async with site.api(request) as api:
        flow = await api.get(kube.path_of("flows", namespace, name))
        schema = (flow.get("spec") or {}).get("input")
        try:
            value = forms.read(schema, fields, "input")
            problems = run_mod.input_problems(schema, value)
        except forms.FormError as exc:
            problems = [str(exc)]
        if problems:
            notices = markup.join(markup.notice(p, error=True) for p in problems)
            body = markup.join([notices, start_form(flow, site.csrf(request), fields)])
            return site.page(request, f"Start {name}", body, status=400)
        created = await actions.start(api, namespace, name, value)
    raise web.HTTPSeeOther(runs_view.href(created))

"""The requests inbox: every pending approval, input and review, decided from the page.

A decision is written by :func:`agentflows.kube.actions.decide` — the patch ``agentflows
approve``/``reject``/``respond`` write — as the caller, with ``decidedBy`` the caller's name as
the API server reports it. The console checks only what makes a decision well-formed (a
decision the request's kind takes; an answer that matches the request's schema, with the field
path when not; edits shaped as the request's kind takes them): the operator's own check,
:func:`agentflows.api.requests.decision_problem`; whether
this user may decide is the API server's call (RBAC and the approvers' admission policy), and
its refusal is shown on the page.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from agentflows.api import flowrun as flowrun_api
from agentflows.api import requests as human_requests
from agentflows.console import forms, markup, runs_view, scope, site
from agentflows.kube import actions
from agentflows.kube import client as kube


def _approvers(request: flowrun_api.HumanRequest) -> str:
    names = [*request.approvers.users, *(f"group {g}" for g in request.approvers.groups)]
    return ", ".join(names) or "anyone who may patch the run's status"


def _facts(run: dict[str, Any], request: flowrun_api.HumanRequest) -> markup.Html:
    meta = run["metadata"]
    facts = [
        ("Run", markup.link(runs_view.href(run), f"{meta.get('namespace') or ''}/{meta['name']}")),
        ("Node", request.node),
        ("Kind", request.kind.value),
        ("Message", request.message),
        ("Summary", request.summary),
        ("Approvers", _approvers(request)),
        ("Requested", request.requested_at or ""),
        ("Expires", request.expires_at or ""),
    ]
    if request.proposal is not None:
        facts.append(("Proposal", markup.json_block(request.proposal)))
    items = markup.join(markup.join([markup.tag("dt", k), markup.tag("dd", v)]) for k, v in facts)
    return markup.tag("dl", items, class_="facts")


def _form(
    request: flowrun_api.HumanRequest, csrf: str, action: str, values: dict[str, str]
) -> markup.Html:
    """The decision form: the answer's fields (from the schema), edits, comment, a button each."""
    allowed = sorted(flowrun_api.DECISIONS.get(request.kind.value, frozenset()))
    fields = [markup.hidden("csrf", csrf)]
    if flowrun_api.Decision.RESPOND in allowed:
        answer = markup.join(
            [markup.tag("legend", "Answer"), forms.fields(request.schema_, values)]
        )
        fields.append(markup.tag("fieldset", answer))
    if flowrun_api.Decision.EDIT in allowed:
        area = markup.tag(
            "textarea", values.get("edits", ""), name="edits", rows="3", spellcheck="false"
        )
        fields.append(markup.tag("label", markup.join([markup.tag("span", "Edits (JSON)"), area])))
    comment = markup.void("input", type="text", name="comment", value=values.get("comment", ""))
    fields.append(markup.tag("label", markup.join([markup.tag("span", "Comment"), comment])))
    buttons = [
        markup.tag("button", d.value, type="submit", name="decision", value=d.value,
                   class_=f"decide-{d.value}")
        for d in allowed
    ]  # fmt: skip
    fields.append(markup.tag("div", markup.join(buttons), class_="buttons"))
    return markup.tag("form", markup.join(fields), method="post", action=action, novalidate=True)


def card(
    run: dict[str, Any],
    rid: str,
    request: flowrun_api.HumanRequest,
    csrf: str,
    *,
    action: str | None = None,
    values: dict[str, str] | None = None,
    problem: str | None = None,
) -> markup.Html:
    """One pending request with its decision form (``values``/``problem``: a refused try).

    ``action``: where the form posts (default: the cluster inbox's path of the request).
    """
    meta = run["metadata"]
    action = action or markup.path("requests", meta.get("namespace") or "", meta["name"], rid)
    parts = [
        markup.tag("h2", f"{meta['name']} · {rid}"),
        markup.notice(problem, error=True) if problem else "",
        _facts(run, request),
        _form(request, csrf, action, values or {}),
    ]
    return markup.tag(
        "article", markup.join(parts), class_="request", id=f"request-{meta['name']}-{rid}"
    )


async def inbox(request: web.Request) -> web.Response:
    """GET /requests: pending requests in the namespace (``namespace=``: all one may list)."""
    namespace = request.query.get("namespace", site.of(request).namespace).strip()
    async with site.api(request) as api:
        namespaces = await scope.chosen(api, site.of(request).namespaces, namespace)
        runs = await scope.list_runs(api, namespaces)
    token = site.csrf(request)
    cards = [
        card(run, rid, pending, token)
        for run in sorted(runs, key=runs_view.key)
        for rid, pending in sorted(runs_view.pending(run).items())
    ]
    done = request.query.get("decided")
    parts = [markup.notice(f"Decided: {done}")] if done else []
    parts.append(
        markup.tag(
            "p",
            f"{len(cards)} pending request(s) in "
            + (namespace or ", ".join(namespaces or []) or "all namespaces"),
            class_="muted",
            id="count",
        )
    )
    parts += cards
    return site.page(request, "Requests", markup.join(parts))


def decision_values(request: flowrun_api.HumanRequest, fields: dict[str, str]) -> dict[str, Any]:
    """The decision's fields from the form; forms.FormError when one is not well-formed.

    What the operator would take back (:func:`human_requests.decision_problem`) is refused on
    the page before it is written.
    """
    decision = fields.get("decision", "")
    wrong = human_requests.kind_problem(request.kind, decision)
    if wrong is not None:
        raise forms.FormError(wrong)
    values: dict[str, Any] = {"decision": decision, "comment": fields.get("comment") or None}
    if decision == flowrun_api.Decision.RESPOND:
        values["data"] = forms.read(request.schema_, fields, "answer")
    if decision == flowrun_api.Decision.EDIT:
        try:
            values["edits"] = json.loads(fields.get("edits") or "null")
        except ValueError as exc:
            raise forms.FormError(f"edits: not JSON ({exc})") from None
        if values["edits"] is None:
            raise forms.FormError("edits: give the replacement as JSON to decide edit")
    decided = request.model_copy(update={**values, "decision": flowrun_api.Decision(decision)})
    problem = human_requests.decision_problem(decided, request.schema_)
    if problem is not None:
        raise forms.FormError(problem)
    return values


async def decide(request: web.Request) -> web.StreamResponse:
    """POST /requests/NS/RUN/ID: write the caller's decision (the CLI's patch)."""
    fields = await site.check_csrf(request)
    namespace, name, rid = (request.match_info[k] for k in ("namespace", "name", "rid"))
    async with site.api(request) as api:
        run = await api.get(kube.path_of("flowruns", namespace, name))
        pending = runs_view.pending(run).get(rid)
        if pending is None:
            body = markup.join(
                [
                    markup.notice(f"request {rid} of {name} is not pending any more", error=True),
                    markup.link("/requests", "Back to the inbox"),
                ]
            )
            return site.page(request, "Requests", body, status=409)
        try:
            values = decision_values(pending, fields)
        except forms.FormError as exc:
            shown = card(run, rid, pending, site.csrf(request), values=fields, problem=str(exc))
            return site.page(request, "Requests", shown, status=400)
        who = await actions.whoami(api)
        await actions.decide(api, namespace, name, rid, decided_by=who, **values)
    done = f"{name} {rid}: {values['decision']} by {who}"
    raise web.HTTPSeeOther(markup.path("requests", decided=done, namespace=namespace))

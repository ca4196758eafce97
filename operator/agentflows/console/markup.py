"""HTML made on the server: every value goes through :func:`text`, so nothing shown executes.

Anything a model, a tool or a webhook produced is untrusted, and so are names and messages:
all of it reaches the page through :func:`text` (``html.escape`` with quotes), or inside
``<pre>`` as escaped JSON. Markup is built only from constants here and in the page modules.
:class:`Html` marks a string that is markup already, so it is not escaped twice.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from typing import Any
from urllib import parse

from agentflows.api import flowrun as flowrun_api

#: Phases shown with a colour, by the CSS class ``phase-<name>``.
PHASE_CLASSES = frozenset(p.value for p in (*flowrun_api.RunPhase, *flowrun_api.NodePhase))


class Html(str):
    """A string that is markup already (made by this module from escaped parts)."""

    __slots__ = ()


def text(value: Any) -> Html:
    """``value`` as text in HTML: ``<script>`` shows as ``<script>``, never runs."""
    if isinstance(value, Html):
        return value
    return Html(html.escape("" if value is None else str(value), quote=True))


def join(parts: Iterable[Any]) -> Html:
    """Parts concatenated, each escaped unless already markup."""
    return Html("".join(text(p) for p in parts))


def tag(element: str, body: Any = "", /, **attributes: Any) -> Html:
    """``<name attr="...">body</name>``; ``class_`` is ``class``; None or False drops one."""
    attrs = "".join(
        f" {key.rstrip('_').replace('_', '-')}" + ("" if value is True else f'="{text(value)}"')
        for key, value in attributes.items()
        if value is not None and value is not False
    )
    return Html(f"<{element}{attrs}>{text(body)}</{element}>")


def void(element: str, /, **attributes: Any) -> Html:
    """An element without a body (``input``, ``meta``)."""
    return Html(tag(element, **attributes)[: -len(f"</{element}>")])


def json_block(value: Any) -> Html:
    """A JSON value, pretty-printed and escaped, in ``<pre>``."""
    if value is None:
        return tag("span", "none", class_="muted")
    shown = value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)
    return tag("pre", shown)


def phase(value: Any) -> Html:
    """A phase badge (the class only for known phases: a class name is never free text)."""
    name = str(value or "Pending")
    css = f"phase phase-{name}" if name in PHASE_CLASSES else "phase"
    return tag("span", name, class_=css)


def table(header: Sequence[str], rows: Iterable[Sequence[Any]], **attributes: Any) -> Html:
    """A table; cells are escaped unless markup."""
    head = tag("thead", tag("tr", join(tag("th", h) for h in header)))
    body = tag("tbody", join(row if isinstance(row, Html) else row_of(row) for row in rows))
    return tag("table", join([head, body]), **attributes)


def row_of(cells: Sequence[Any], **attributes: Any) -> Html:
    """One table row."""
    return tag("tr", join(tag("td", c) for c in cells), **attributes)


def link(href: str, body: Any) -> Html:
    """A link to a console path (only paths this module builds: never a URL from a run)."""
    return tag("a", body, href=href)


def path(*parts: str, **query: str | None) -> str:
    """A console path with every part URL-quoted, e.g. ``/runs/ns/name``."""
    built = "/" + "/".join(parse.quote(p, safe="") for p in parts)
    kept = {k: v for k, v in query.items() if v}
    return built + ("?" + parse.urlencode(kept) if kept else "")


def hidden(name: str, value: str) -> Html:
    """A hidden form field."""
    return void("input", type="hidden", name=name, value=value)


def button_form(action: str, label: str, csrf: str, **fields: str) -> Html:
    """A one-button POST form (cancel, re-run, resume), carrying the CSRF token."""
    inputs = [hidden("csrf", csrf), *(hidden(k, v) for k, v in fields.items())]
    return tag(
        "form",
        join([*inputs, tag("button", label, type="submit")]),
        method="post",
        action=action,
        class_="inline",
    )


def page(title: str, body: Html, *, user: str, live: str | None = None) -> Html:
    """The whole page: header with the signed-in user, navigation, ``body``.

    ``live``: the event-stream path the script follows (``data-live`` on ``<main>``).
    """
    nav = join(
        link(href, label)
        for href, label in (("/runs", "Runs"), ("/requests", "Requests"), ("/flows", "Flows"))
    )
    header = tag(
        "header",
        join([tag("strong", "agentflows"), tag("nav", nav), tag("span", user, class_="user")]),
    )
    head = join(
        [
            Html('<meta charset="utf-8">'),
            tag("title", f"{title} · agentflows"),
            void("link", rel="stylesheet", href="/static/console.css"),
            Html('<script src="/static/console.js" defer></script>'),
        ]
    )
    main = tag("main", join([tag("h1", title), body]), data_live=live)
    return Html(
        f'<!doctype html>\n<html lang="en">{tag("head", head)}'
        f"{tag('body', join([header, main]))}</html>"
    )


def notice(message: Any, *, error: bool = False) -> Html:
    """A message box (an error in red), e.g. the API server's refusal."""
    return tag("p", message, class_="notice error" if error else "notice", role="alert")

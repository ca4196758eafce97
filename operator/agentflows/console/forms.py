"""Forms generated from a JSON Schema (a Flow's ``spec.input``, an input request's schema).

An object schema with ``properties`` becomes one field per property: a select for an
``enum``, a checkbox for a boolean, a number field for an integer or number, a text field for
a string, and a JSON text area for anything else (objects, arrays, unions). Any other schema is
one JSON text area. :func:`read` turns the submitted fields back into a value; the caller then
checks it against the schema on the server (the browser's checks are not relied on: the form
says ``novalidate``), and the page shows each problem with its field path.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agentflows.api import errors
from agentflows.console import markup

#: Field name prefix, so a property called ``csrf`` cannot collide with the form's own fields.
PREFIX = "field."
#: The one field of a form whose schema has no properties.
WHOLE = "json"


def _properties(schema: Any) -> dict[str, Any] | None:
    if not isinstance(schema, dict) or schema.get("type") not in (None, "object"):
        return None
    properties = schema.get("properties")
    return properties if isinstance(properties, dict) else None


def fields(schema: Any, values: Mapping[str, str] | None = None) -> markup.Html:
    """The inputs of a form for ``schema``, filled with ``values`` (the last submission)."""
    values = values or {}
    properties = _properties(schema)
    if properties is None:
        return _label("Value (JSON)", _area(WHOLE, values.get(WHOLE, "")))
    required = set(schema.get("required") or [])
    parts = []
    for name, prop in properties.items():
        label = name + (" *" if name in required else "")
        described = prop.get("description") if isinstance(prop, dict) else None
        field = _field(PREFIX + name, prop if isinstance(prop, dict) else {}, values)
        hint = markup.tag("small", described) if described else ""
        parts.append(_label(label, markup.join([field, hint])))
    return markup.join(parts)


def _label(label: str, field: markup.Html) -> markup.Html:
    return markup.tag("label", markup.join([markup.tag("span", label), field]))


def _area(name: str, value: str) -> markup.Html:
    return markup.tag("textarea", value, name=name, rows="4", spellcheck="false")


def _field(name: str, prop: dict[str, Any], values: Mapping[str, str]) -> markup.Html:
    value = values.get(name, "")
    kind = prop.get("type")
    if isinstance(prop.get("enum"), list):
        options = [markup.tag("option", "", value="")]
        for choice in prop["enum"]:
            shown = json.dumps(choice) if not isinstance(choice, str) else choice
            selected = shown == value
            options.append(markup.tag("option", shown, value=shown, selected=selected))
        return markup.tag("select", markup.join(options), name=name)
    if kind == "boolean":
        return markup.void("input", type="checkbox", name=name, value="true", checked=bool(value))
    if kind in ("integer", "number"):
        step = "1" if kind == "integer" else "any"
        return markup.void("input", type="number", name=name, value=value, step=step)
    if kind == "string":
        return markup.void("input", type="text", name=name, value=value)
    return _area(name, value)


class FormError(errors.AgentflowsError):
    """A field cannot be read as its type; the message names the field."""


def read(schema: Any, form: Mapping[str, str], root: str) -> Any:
    """The value the submitted ``form`` gives for ``schema`` (empty fields are left out).

    ``root`` names the value in messages: ``input.count: 'x' is not a whole number``.
    """
    properties = _properties(schema)
    if properties is None:
        return _json(form.get(WHOLE, ""), root)
    value: dict[str, Any] = {}
    for name, prop in properties.items():
        prop = prop if isinstance(prop, dict) else {}
        raw = form.get(PREFIX + name, "")
        if prop.get("type") == "boolean":
            value[name] = raw == "true"
            continue
        if raw.strip() == "":
            continue
        value[name] = _typed(f"{root}.{name}", prop, raw)
    return value


def _typed(where: str, prop: dict[str, Any], raw: str) -> Any:
    kind = prop.get("type")
    choices = prop.get("enum")
    if kind == "string" or (isinstance(choices, list) and raw in choices):
        return raw
    if kind == "integer":
        try:
            return int(raw)
        except ValueError:
            raise FormError(f"{where}: {raw!r} is not a whole number") from None
    if kind == "number":
        try:
            return float(raw)
        except ValueError:
            raise FormError(f"{where}: {raw!r} is not a number") from None
    return _json(raw, where)


def _json(raw: str, where: str) -> Any:
    if raw.strip() == "":
        return None
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise FormError(f"{where}: not JSON ({exc})") from None

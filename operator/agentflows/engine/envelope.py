"""The ``{json, text, raw}`` envelope every node output is wrapped in.

``json`` is the structured value (parsed from the text when the text is JSON, possibly inside a
fenced block), ``text`` is the human-readable text and ``raw`` the provider's raw reply where
there is one. Downstream expressions bind to ``.nodes.<id>.json`` or ``.text``.
"""

from __future__ import annotations

import json
import re
from typing import Any

_FENCE = re.compile(r"```(?:json)?\s*\n(.*?)\n\s*```", re.DOTALL)
#: ``json.dumps(value, ensure_ascii=False)`` without an encoder built per call (every
#: transform and branch output that is not a string is encoded here).
_TEXT = json.JSONEncoder(ensure_ascii=False).encode


def parse_json_text(text: str) -> Any:
    """Parse JSON from a model's text: the whole text, or a fenced block; None if neither."""
    stripped = text.strip()
    if not stripped:
        return None
    try:
        return json.loads(stripped)
    except ValueError:
        pass
    match = _FENCE.search(text)
    if match:
        try:
            return json.loads(match.group(1))
        except ValueError:
            return None
    return None


def from_text(text: str, raw: Any = None) -> dict[str, Any]:
    """Wrap a model's text reply: ``json`` is the parsed JSON when there is any."""
    return {"json": parse_json_text(text), "text": text, "raw": raw}


def from_value(value: Any, raw: Any = None) -> dict[str, Any]:
    """Wrap a structured value: ``text`` is the value as a string (strings stay themselves)."""
    text = value if isinstance(value, str) else _TEXT(value)
    return {"json": value, "text": text, "raw": raw}

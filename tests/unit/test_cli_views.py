"""The CLI's JSON output: the same text as the standard library's, for any value a run holds."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentflows.cli import views

VALUES: list[Any] = [
    {"phase": "Succeeded", "output": {"text": "Grüße", "n": 1.5, "ok": True, "none": None}},
    {"nodes": {"fan[0]": {"phase": "Succeeded"}, "fan[1]": {}}, "items": [], "empty": {}},
    {"big": 2**70, "negative": -(2**65)},  # beyond what a 64-bit encoder takes
]


@pytest.mark.parametrize("value", VALUES)
def test_json_output_is_the_standard_indented_text(value: Any) -> None:
    assert views.dump(value, "json") == json.dumps(value, indent=2, ensure_ascii=False)

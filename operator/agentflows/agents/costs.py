"""Prices, context windows and token estimates, from litellm's table without importing litellm.

Called by :mod:`agentflows.agents.model` (the cost of each reply) and
:mod:`agentflows.agents.compression` (the context window, and how full it is).

litellm takes seconds to import; a runner pod that only talks to an OpenAI-compatible endpoint
never needs it. So the price table is read from the JSON file that ships inside the litellm
package (``model_prices_and_context_window_backup.json``, the same table
``LITELLM_LOCAL_MODEL_COST_MAP=True`` makes litellm use), found with
:func:`importlib.util.find_spec` without executing litellm. When litellm is already imported (a
provider that needs it was called), its in-memory ``litellm.model_cost`` is used instead: same
data, no second parse.

A model missing from the table costs 0 and :class:`Price` says it is unknown; its context window
is :data:`DEFAULT_CONTEXT_WINDOW` unless the Agent sets ``model.contextWindow``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from agentflows.agents.litellm_import import import_litellm

#: Context window assumed for a model the table does not know (docs/architecture.md).
DEFAULT_CONTEXT_WINDOW = 128_000
#: Characters per token in the rough estimate used when no tokenizer applies.
CHARS_PER_TOKEN = 4
_TABLE_FILE = "model_prices_and_context_window_backup.json"


@dataclasses.dataclass(frozen=True)
class Price:
    """What one model call cost; ``known`` is False when the model is not in the table."""

    cost_usd: float
    known: bool


@functools.cache
def _bundled_table() -> Mapping[str, Any]:
    """The price table shipped inside the litellm package (empty when litellm is missing)."""
    spec = importlib.util.find_spec("litellm")
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(location, _TABLE_FILE)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as handle:
                table: Mapping[str, Any] = json.load(handle)
            return table
    return {}


def _table() -> Mapping[str, Any]:
    litellm = sys.modules.get("litellm")
    cost_map = getattr(litellm, "model_cost", None) if litellm is not None else None
    return cost_map if isinstance(cost_map, Mapping) and cost_map else _bundled_table()


def model_entry(model_name: str) -> Mapping[str, Any] | None:
    """The table's entry for a litellm model string (tried as given, then without provider)."""
    table = _table()
    _, slash, bare = model_name.partition("/")
    for key in (model_name, bare if slash else None):
        if key and isinstance(table.get(key), Mapping):
            entry: Mapping[str, Any] = table[key]
            return entry
    return None


def price(model_name: str, prompt_tokens: int, completion_tokens: int) -> Price:
    """The cost of a call with these token counts (0 and unknown when the model is not listed)."""
    entry = model_entry(model_name)
    if entry is None:
        return Price(0.0, False)
    per_input = float(entry.get("input_cost_per_token") or 0.0)
    per_output = float(entry.get("output_cost_per_token") or 0.0)
    return Price(max(prompt_tokens * per_input + completion_tokens * per_output, 0.0), True)


def context_window(model_name: str, configured: int | None) -> int:
    """The context window in tokens: the Agent's setting, else the table's, else the default."""
    if configured:
        return configured
    entry = model_entry(model_name) or {}
    for key in ("max_input_tokens", "max_tokens"):
        value = entry.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return DEFAULT_CONTEXT_WINDOW


def rough_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """Characters / 4 over the messages' text, tool calls included: cheap and model-agnostic."""
    return sum(len(_message_text(message)) for message in messages) // CHARS_PER_TOKEN + 1


def count_tokens(model_name: str, messages: Sequence[Mapping[str, Any]]) -> int:
    """Tokens by litellm's counter for a model it knows, else :func:`rough_tokens`.

    This imports litellm (seconds, once); :mod:`agentflows.agents.compression` calls it only when
    the rough estimate says the conversation is near its threshold.
    """
    if model_entry(model_name) is None:
        return rough_tokens(messages)
    litellm = import_litellm()
    try:
        return int(litellm.token_counter(model=model_name, messages=[dict(m) for m in messages]))
    except Exception:
        return rough_tokens(messages)


def _message_text(message: Mapping[str, Any]) -> str:
    parts = [str(message.get("content") or "")]
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        parts.append(str(function.get("name") or ""))
        parts.append(str(function.get("arguments") or ""))
    return "".join(parts)

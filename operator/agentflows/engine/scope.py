"""The expression scope of a (sub-)flow: ``{run, nodes, ...}`` as JSON text, built incrementally.

The run loop adds each finished node's output once; node kinds ask for a scope (with ``item``
and ``items`` for map bodies) and expressions render only the node outputs they read.
"""

from __future__ import annotations

import json
from typing import Any

from agentflows.engine import expressions


class ScopeBuilder:
    """Builds the expression scope as JSON text, serialising each node output only once."""

    def __init__(self, run_values: dict[str, Any], *, deadline: float | None = None) -> None:
        self.run_values = run_values
        #: A time.monotonic() instant every expression over this scope must finish by.
        self.deadline = deadline
        self._run_json = expressions.scope_json(run_values)
        self._outputs: dict[str, Any] = {}
        self._parts: dict[str, str] = {}
        self._iterations: dict[str, dict[int, Any]] = {}
        #: ``.iterations`` as values, and as JSON text once a program read them, until an
        #: iteration is added or dropped.
        self._iterations_cache: dict[str, list[Any]] | None = None
        self._iterations_json: str | None = None

    def add(self, node_id: str, output: Any, iteration: int | None = None) -> None:
        """Make a node's output visible at ``.nodes.<id>``.

        A node in a loop passes its ``iteration``: its outputs are also kept at
        ``.iterations.<id>``, a list by iteration (``[0]`` the first, ``[-1]`` the latest).
        """
        self._outputs[node_id] = output
        self._parts[node_id] = json.dumps(node_id) + ":" + expressions.scope_json(output)
        if iteration is not None:
            self._iterations.setdefault(node_id, {})[iteration] = output
            self._iterations_cache = self._iterations_json = None

    def forget(self, node_id: str, iterations: range) -> None:
        """Drop ``iterations`` of a node from ``.iterations.<id>`` (they were folded)."""
        kept = self._iterations.get(node_id, {})
        for n in iterations:
            kept.pop(n, None)
        self._iterations_cache = self._iterations_json = None

    def _iterations_now(self) -> dict[str, list[Any]]:
        if self._iterations_cache is None:
            self._iterations_cache = {
                node_id: [by_number[n] for n in sorted(by_number)]
                for node_id, by_number in self._iterations.items()
            }
        return self._iterations_cache

    def _iterations_text(self) -> str:
        """``,"iterations":{...}`` for a rendered scope ("" outside loops)."""
        if self._iterations_json is None:
            values = self._iterations_now()
            text = expressions.scope_json(values) if values else ""
            self._iterations_json = ',"iterations":' + text if text else ""
        return self._iterations_json

    @property
    def outputs(self) -> dict[str, Any]:
        """Outputs by node id."""
        return self._outputs

    def scope(self, **extra: Any) -> expressions.Scope:
        """The scope ``{run, nodes, ...extra}``."""
        tail = "".join(
            "," + json.dumps(key) + ":" + expressions.scope_json(value)
            for key, value in extra.items()
        )
        parts = self._parts

        def render(needs: frozenset[str] | None) -> str:
            if needs is None:
                chosen = ",".join(parts.values())
            else:
                chosen = ",".join(parts[n] for n in needs if n in parts)
            # a program that never says "iterations" is not handed them (jq parses its input)
            reads = needs is None or expressions.ITERATIONS in needs
            earlier = self._iterations_text() if reads else ""
            return '{"run":' + self._run_json + ',"nodes":{' + chosen + "}" + earlier + tail + "}"

        def values() -> dict[str, Any]:
            iterations = self._iterations_now()
            earlier = {"iterations": iterations} if iterations else {}
            return {"run": self.run_values, "nodes": self._outputs, **earlier, **extra}

        return expressions.Scope(values, render, deadline=self.deadline)

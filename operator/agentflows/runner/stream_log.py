"""The runner's log of streamed answers: one JSON line per piece, framed apart from log lines.

The runner pod's log (stdout) carries its progress lines, each starting with a timestamp, and
the answers of agent and ``llm`` nodes as the model writes them, each piece a JSON line of its
own that no progress line can look like::

    {"stream": {"node": "answer", "delta": "Restart the "}}
    {"stream": {"node": "answer", "restart": true}}   # the attempt broke off; a retry starts over
    {"stream": {"node": "answer", "end": true}}       # the model call ended

Tools following the pod's log through the API server tell them apart by the first characters
(``{"stream":``). The text is redacted before it gets here
(:class:`agentflows.agents.streaming.Writer`); nothing of it goes into the FlowRun's status.
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

#: How a streamed line starts (and a progress line never does).
PREFIX = '{"stream":'


class LogListener:
    """A :class:`agentflows.agents.streaming.Listener` writing framed lines to ``out``."""

    def __init__(self, out: TextIO | None = None) -> None:
        self._out = out

    def text(self, node: str, text: str) -> None:
        """One piece of ``node``'s answer."""
        self._line({"node": node, "delta": text})

    def restart(self, node: str) -> None:
        """The attempt being streamed broke off and is retried."""
        self._line({"node": node, "restart": True})

    def end(self, node: str) -> None:
        """The model call ended."""
        self._line({"node": node, "end": True})

    def _line(self, event: dict[str, Any]) -> None:
        out = self._out or sys.stdout
        out.write(json.dumps({"stream": event}, ensure_ascii=False) + "\n")
        out.flush()


def parse(line: str) -> dict[str, Any] | None:
    """The event of a streamed line, or None for any other log line."""
    if not line.startswith(PREFIX):
        return None
    try:
        event = json.loads(line).get("stream")
    except (ValueError, AttributeError):
        return None
    return event if isinstance(event, dict) else None

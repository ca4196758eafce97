"""``agentflows run --stream``: agents' answers printed on stderr as the model writes them.

A :class:`agentflows.agents.streaming.Listener` for a person at a terminal: each node's text
goes to stderr as it arrives (already redacted by the agents layer), under a ``node ▸`` lead
whenever the node speaking changes (parallel nodes interleave). A retried attempt is marked and
starts over; a finished call ends its line. stdout is untouched: it keeps the run's final JSON.
``--stream`` turns it on, ``--no-stream`` off; by default it is on when stderr is a terminal.
"""

from __future__ import annotations

import sys
from typing import TextIO

import click


def wanted(flag: bool | None, stderr: TextIO | None = None) -> bool:
    """Whether to stream: the flag when given, else whether stderr is a terminal."""
    if flag is not None:
        return flag
    return (stderr or sys.stderr).isatty()


stream_option = click.option(
    "--stream/--no-stream",
    "stream",
    default=None,
    help="Print agents' answers on stderr as they are written (default: on a terminal).",
)


class TerminalListener:
    """Writes streamed answers to ``out`` (stderr), one lead line per change of node."""

    def __init__(self, out: TextIO | None = None) -> None:
        self._out = out or sys.stderr
        self._speaking: str | None = None
        self._open = False

    def text(self, node: str, text: str) -> None:
        """Print the next piece of ``node``'s answer."""
        if node != self._speaking:
            self._finish_line()
            self._out.write(f"  {node} ▸ ")
            self._speaking = node
        self._out.write(text)
        self._open = True
        self._out.flush()

    def restart(self, node: str) -> None:
        """The attempt broke off: say so; the retry's text follows from its start."""
        self._finish_line()
        self._out.write(f"  {node} ▸ (the stream broke off; retrying from the start)\n")
        self._out.flush()
        self._speaking = None

    def end(self, node: str) -> None:
        """The call ended: close its line."""
        if node == self._speaking:
            self._finish_line()
            self._speaking = None

    def break_line(self) -> None:
        """End an open line of text, so another line may be printed; more text gets a lead."""
        self._finish_line()
        self._speaking = None

    def _finish_line(self) -> None:
        if self._open:
            self._out.write("\n")
            self._out.flush()
            self._open = False

"""Where an answer goes while the model writes it: the stream of one node, redacted.

A host that shows answers as they arrive (``agentflows run`` on a terminal or with
``--stream``, the runner pod's log) gives :class:`agentflows.agents.host.LiveCapabilities` a
:class:`Listener`. The agent turn and the ``llm`` node then hand the model client
(:func:`agentflows.agents.model.complete`) a :class:`Writer` for their node, and the client asks
the endpoint for a stream. What is recorded does not change: the reply is assembled from the
stream into the same result as an unstreamed one (output, usage, cost).

A :class:`Writer` redacts before anything reaches the listener, with the one redaction owner
(:class:`agentflows.agents.secrets.StreamRedactor`: a secret split across two chunks is still
masked). When an attempt breaks off and the client retries it, the listener is told
(:meth:`Listener.restart`): what it showed of that attempt is void, the next attempt starts
again from its first token. Sub-agents do not stream: their answer goes to their caller, not
to the person waiting.
"""

from __future__ import annotations

from typing import Protocol

from agentflows.agents import secrets


class Listener(Protocol):
    """Receives the streamed text of running nodes (node keys tell parallel nodes apart)."""

    def text(self, node: str, text: str) -> None:
        """The next piece of node ``node``'s answer (already redacted)."""

    def restart(self, node: str) -> None:
        """The attempt being streamed broke off and is retried: its text so far is void."""

    def end(self, node: str) -> None:
        """The model call ended (answered or failed): nothing more comes for it."""


class Writer:
    """One model call's stream to a listener, redacted (see module docstring)."""

    def __init__(self, listener: Listener, node: str, redactor: secrets.Redactor) -> None:
        self._listener = listener
        self._node = node
        self._redacting = secrets.StreamRedactor(redactor)

    def piece(self, text: str) -> None:
        """Pass on a piece of the answer, holding back what may be the start of a secret."""
        shown = self._redacting.feed(text)
        if shown:
            self._listener.text(self._node, shown)

    def restart(self) -> None:
        """The attempt broke off and will be retried."""
        self._redacting.discard()
        self._listener.restart(self._node)

    def abandon(self) -> None:
        """The call failed for good: what was held back is not shown."""
        self._redacting.discard()
        self._listener.end(self._node)

    def end(self) -> None:
        """The call was answered: pass on what was held back."""
        rest = self._redacting.flush()
        if rest:
            self._listener.text(self._node, rest)
        self._listener.end(self._node)

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

:func:`follow_run` is the reading side, for ``agentflows watch --stream`` and the console's
run page: the stream events of a run's runner pods, read from each pod's log (``follow=true``)
through the API server with the caller's own client, so RBAC's ``pods/log`` decides who sees
the text.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from typing import Any, Protocol, TextIO

from agentflows.api import flowrun as flowrun_api
from agentflows.api import retry
from agentflows.kube import client as kube

#: How a streamed line starts (and a progress line never does).
PREFIX = '{"stream":'
#: Longest wait between two looks at a run whose pod has no log yet (it is being created).
LOOK_AGAIN_SECONDS = 2.0
#: The waits between looks: 0.1 s after new text, doubling up to LOOK_AGAIN_SECONDS without.
LOOK_AGAIN = retry.Backoff(initial=0.1, cap=LOOK_AGAIN_SECONDS)
#: A run whose phase is one of these has no runner pod to come, so there is no more text.
SETTLED = frozenset(
    {*(p for p in flowrun_api.RunPhase if p.terminal), flowrun_api.RunPhase.WAITING}
)


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


class Listener(Protocol):
    """Where :func:`deliver` hands events (:class:`agentflows.agents.streaming.Listener`)."""

    def text(self, node: str, text: str) -> None:
        """A piece of ``node``'s answer."""

    def restart(self, node: str) -> None:
        """The attempt broke off; its text so far is void."""

    def end(self, node: str) -> None:
        """The call ended."""


def deliver(event: dict[str, Any], listener: Listener) -> None:
    """Hand one parsed stream event to ``listener``."""
    node = str(event.get("node") or "")
    if "delta" in event:
        listener.text(node, str(event["delta"]))
    elif event.get("restart"):
        listener.restart(node)
    elif event.get("end"):
        listener.end(node)


async def follow_pod(api: kube.Client, namespace: str, pod: str) -> AsyncIterator[dict[str, Any]]:
    """The stream events of ``pod``'s log from its start until its container has ended.

    Raises :class:`kube.ApiError`: 400 while the container is still being created, 403 when
    the caller may not read ``pods/log``, 404 when the pod is gone (or not made yet), 5xx
    when the API server could not reach the node's kubelet.
    """
    path = kube.path_of("pods", namespace, pod, sub="log")
    async for line in api.follow_lines(path, follow=True):
        event = parse(line)
        if event is not None:
            yield event


async def follow_run(api: kube.Client, namespace: str, name: str) -> AsyncIterator[dict[str, Any]]:
    """The stream events of run ``name``, pod after pod, until it has ended or waits.

    The current runner pod (``status.pod``) is followed from the start of its log, so what it
    wrote before the caller came is shown too. When its log ends (the container ended, or the
    connection broke off) while the run goes on, it is followed again — its events already
    yielded are skipped — until the run has moved to another pod or settled; a run read as
    settled ends the follower once its pod's log has been read to its end. Between looks the
    delay grows up to :data:`LOOK_AGAIN_SECONDS` while nothing new comes. Raises
    :class:`kube.ApiError` when the caller may not read the run or its pod's log (403).
    """
    run_path = kube.path_of("flowruns", namespace, name)
    yielded: dict[str, int] = {}
    looks = LOOK_AGAIN.tries()
    while True:
        status = flowrun_api.status_of(await api.get(run_path))
        pod = status.pod or ""
        before = sum(yielded.values())
        if pod:
            try:
                number = 0
                async for event in follow_pod(api, namespace, pod):
                    number += 1
                    if number > yielded.get(pod, 0):
                        yielded[pod] = number
                        yield event
            except kube.ApiError as exc:
                if exc.status not in (400, 404) and not exc.retryable:
                    raise
                # not created yet, gone, or its node did not answer: look again
        if status.phase in SETTLED:
            return
        if sum(yielded.values()) > before:
            looks.reset()
        await asyncio.sleep(looks.next_delay())

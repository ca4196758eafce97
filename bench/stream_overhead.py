"""Streaming's CPU cost on a run: the same scripted answer, streamed to the runner's log or not.

Run ``python bench/stream_overhead.py`` (about 20 s) or ``--reps N``. A one-node Flow whose
``agent`` node's model is the scripted OpenAI-compatible server of the tests
(``tests/support/model_server.py``, the direct OpenAI-compatible path) runs in this process
with the engine and :class:`agentflows.agents.host.LiveCapabilities`, as the runner runs it:

- ``streamed``: with the runner's listener (:class:`agentflows.runner.stream_log.LogListener`,
  framed JSON lines, here to ``/dev/null``), so the request asks for ``stream: true`` and every
  piece goes through the redactor and the listener;
- ``whole``: without a listener, one JSON answer.

The server runs in a child process, so its work (writing a few hundred SSE events) is not
counted; each run's CPU is this process's user + system time (``resource.getrusage``) around
the run, and the runs alternate so background load hits both alike. Printed: the median CPU
per run of each, and the overhead of streaming in per cent and per piece.

``--processes N`` also runs the whole command N times each way, ``agentflows run FLOW
--stream`` (stderr to ``/dev/null``) and ``--no-stream``, and prints the median CPU of a
child process (``RUSAGE_CHILDREN``): what streaming adds to a run, imports and all.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, TextIO

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.model_server import Reply, ScriptedModelServer  # noqa: E402

from agentflows.agents import host  # noqa: E402
from agentflows.api import agent as agent_api  # noqa: E402
from agentflows.api import flow as flow_api  # noqa: E402
from agentflows.engine import graph, run, store  # noqa: E402
from agentflows.runner import stream_log  # noqa: E402

#: Words of the scripted answer (each a streamed piece): a long answer, as a report is.
WORDS = 600


def _serve(reps: int, ready: Any, done: Any) -> None:
    """Serve the scripted answer from another process (``ready``/``done``: its Queue, Event)."""
    server = ScriptedModelServer().start()
    answer = " ".join(f"word{i}" for i in range(WORDS))
    server.script(*[Reply.text(answer) for _ in range(2 * reps + 2)])
    ready.put(server.url)
    done.wait()
    server.stop()


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _one(url: str, streamed: bool, sink: TextIO) -> float:
    model = agent_api.ModelSpec(
        name="openai/scripted-model", api_base=url, retries=0, timeout_seconds=30
    )
    flow = flow_api.FlowSpec.model_validate(
        {"nodes": [{"id": "answer", "agent": {"name": "writer", "prompt": "Write."}}]}
    )
    resolver = graph.StaticResolver({"writer": agent_api.AgentSpec(model=model)}, {"f": flow})
    listener = stream_log.LogListener(sink) if streamed else None
    caps = host.LiveCapabilities(resolver, listener=listener)
    compiled = graph.compile_flow(flow, resolver)
    before = _cpu()
    outcome = await run.run_flow(
        compiled,
        run_name="bench",
        input_value=None,
        store_=store.MemoryStore(),
        caps=caps,
        resolver=resolver,
    )
    spent = _cpu() - before
    assert outcome.phase.value == "Succeeded", outcome.message
    return spent


async def _measure(url: str, reps: int, sink: TextIO) -> dict[str, list[float]]:
    seen: dict[str, list[float]] = {"whole": [], "streamed": []}
    for rep in range(reps + 1):
        for streamed in (False, True):
            spent = await _one(url, streamed, sink)
            if rep:  # the first pair warms imports and connections
                seen["streamed" if streamed else "whole"].append(spent)
    return seen


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _processes(url: str, reps: int) -> dict[str, list[float]]:
    """CPU of whole ``agentflows run`` processes, streamed and not, alternating."""
    seen: dict[str, list[float]] = {"whole": [], "streamed": []}
    with tempfile.TemporaryDirectory() as tmp:
        flow = Path(tmp) / "flow.yaml"
        flow.write_text(
            "apiVersion: agentflows.io/v1alpha1\nkind: Agent\nmetadata: {name: writer}\n"
            f"spec: {{model: {{name: openai/scripted-model, apiBase: '{url}', retries: 0}}}}\n"
            "---\napiVersion: agentflows.io/v1alpha1\nkind: Flow\nmetadata: {name: f}\n"
            "spec: {nodes: [{id: answer, agent: {name: writer, prompt: Write.}}]}\n"
        )
        for rep in range(reps):
            for streamed in (False, True):
                before = _children_cpu()
                subprocess.run(
                    [sys.executable, "-m", "agentflows.cli.main", "run", str(flow), "-q",
                     "--name", f"r{rep}{int(streamed)}", "--state-dir", str(Path(tmp) / "runs"),
                     "--stream" if streamed else "--no-stream"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
                )  # fmt: skip
                seen["streamed" if streamed else "whole"].append(_children_cpu() - before)
    return seen


def _print(title: str, seen: dict[str, list[float]], reps: int) -> None:
    whole, streamed = statistics.median(seen["whole"]), statistics.median(seen["streamed"])
    print(f"{title}, answer of {WORDS} pieces, {reps} runs each (median CPU, user+system):")
    print(f"  whole     {whole * 1000:8.2f} ms")
    print(f"  streamed  {streamed * 1000:8.2f} ms")
    extra = streamed - whole
    print(
        f"  overhead  {extra * 1000:8.2f} ms ({extra / whole * 100:+.1f}%), "
        f"{extra / WORDS * 1e6:.1f} us per piece"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--processes", type=int, default=0, metavar="N")
    args = parser.parse_args()
    reps = args.reps
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    context = multiprocessing.get_context("fork")
    ready, done = context.Queue(), context.Event()
    child = context.Process(
        target=_serve, args=(reps + 2 * args.processes, ready, done), daemon=True
    )
    child.start()
    url = ready.get(timeout=60)
    try:
        with open(os.devnull, "w") as sink:
            seen = asyncio.run(_measure(url, reps, sink))
        _print("In this process", seen, reps)
        if args.processes:
            _print("agentflows run processes", _processes(url, args.processes), args.processes)
    finally:
        done.set()
        child.join(timeout=10)


if __name__ == "__main__":
    main()

"""Agents benchmark: parallel sub-agents, cold start to the first model request, litellm import.

Run ``python bench/agents.py`` (about 30 s) or ``python bench/agents.py --quick`` (about 12 s).
Everything talks over real HTTP to the scripted OpenAI-compatible server of the tests
(``tests/support/model_server.py``) on loopback, whose replies can be delayed.

1. ``sub-agents``: a lead agent asks four sub-agents (``call_sub_agent``) whose model answers
   after 1 s (delay injected by the server). Parallel: the four calls in one model reply (the
   turn runs them concurrently); sequential peer: one call per reply, four rounds. Wall time of
   the lead's whole turn (six or nine model calls), median over the repetitions. Targets:
   parallel <= 1.3 s, sequential >= 4 s.
2. ``cold start``: spawn ``agentflows run`` on a one-agent Flow whose model is the scripted
   server (``openai/...`` + ``apiBase``: the direct OpenAI-compatible path, no litellm) and time
   spawn -> the first chat-completions request arriving at the server, median of 5. It is the
   runner's path minus the Kubernetes client (whose import is timed on its own line). Target
   <= 1.5 s.
3. ``import litellm``: a fresh interpreter importing litellm alone
   (``LITELLM_LOCAL_MODEL_COST_MAP=True``), median of 3 — what every cold start paid before
   the direct path, and still pays for providers that need litellm.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.model_server import Reply, ScriptedModelServer, ToolCall  # noqa: E402

from agentflows.agents import host  # noqa: E402
from agentflows.api import agent as agent_api  # noqa: E402
from agentflows.api import flow as flow_api  # noqa: E402
from agentflows.engine import capabilities  # noqa: E402

SUB_AGENTS = 4
SUB_AGENT_DELAY_S = 1.0
PARALLEL_TARGET_S = 1.3
SEQUENTIAL_FLOOR_S = 4.0
COLD_START_TARGET_S = 1.5


def _resolver(server: ScriptedModelServer) -> host.MappingResolver:
    names = [f"worker{i}" for i in range(SUB_AGENTS)]
    lead = agent_api.AgentSpec(model=server.model_spec(), sub_agents=names)
    workers = {n: agent_api.AgentSpec(model=server.model_spec()) for n in names}
    return host.MappingResolver({"lead": lead, **workers})


def _call(i: int) -> ToolCall:
    return ToolCall("call_sub_agent", {"agent": f"worker{i}", "prompt": f"part {i}"})


async def _turn(server: ScriptedModelServer, replies: list[Reply]) -> float:
    server.script(*replies)
    resolver = _resolver(server)
    caps = host.LiveCapabilities(resolver, env=server.env)
    lead = resolver.agent("lead")
    assert lead is not None
    ctx = capabilities.NodeContext("bench", "lead", 0, flow_api.Autonomy.FULL)
    started = time.perf_counter()
    result = await caps.run_agent(capabilities.AgentTask("lead", lead, "Split the work."), ctx)
    elapsed = time.perf_counter() - started
    assert isinstance(result, capabilities.NodeResult), result
    assert server.pending == 0, "the turn did not use every scripted reply"
    return elapsed


async def sub_agents(server: ScriptedModelServer, reps: int) -> tuple[float, float]:
    """Median wall time of the lead's turn: all calls in one reply, then one call per reply."""
    delayed = [Reply.text('{"ok": true}', delay=SUB_AGENT_DELAY_S) for _ in range(SUB_AGENTS)]
    parallel, sequential = [], []
    for _ in range(reps):
        replies = [Reply.calls(*map(_call, range(SUB_AGENTS))), *delayed, Reply.text("done")]
        parallel.append(await _turn(server, replies))
        one_by_one: list[Reply] = []
        for i in range(SUB_AGENTS):
            one_by_one += [Reply.calls(_call(i)), delayed[i]]
        sequential.append(await _turn(server, [*one_by_one, Reply.text("done")]))
    return statistics.median(parallel), statistics.median(sequential)


def _cli() -> list[str]:
    """The console script next to this interpreter (no pyenv shim), else ``-m``."""
    script = Path(sys.executable).with_name("agentflows")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "agentflows.cli.main"]


def cold_start(server: ScriptedModelServer, reps: int) -> float:
    """Median time from spawning ``agentflows run`` to the first model request."""
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        flow = Path(tmp) / "flow.yaml"
        flow.write_text(
            textwrap.dedent(f"""
                apiVersion: agentflows.io/v1alpha1
                kind: Agent
                metadata: {{name: helper}}
                spec:
                  model: {{name: openai/scripted-model, apiBase: "{server.url}", retries: 0}}
                  systemPrompt: You help.
                ---
                apiVersion: agentflows.io/v1alpha1
                kind: Flow
                metadata: {{name: hello}}
                spec:
                  nodes:
                    - {{id: ask, agent: {{name: helper, prompt: Hello.}}}}
            """)
        )
        env = {**os.environ, "AGENTFLOWS_STATE_DIR": str(Path(tmp) / "runs")}
        for rep in range(reps):
            server.script(Reply.text("hi"))
            seen = len(server.requests)
            started = time.perf_counter()
            process = subprocess.Popen(
                [*_cli(), "run", str(flow), "--name", f"cold-{rep}", "-q"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            while len(server.requests) == seen:
                if process.poll() is not None:
                    error = process.stderr.read() if process.stderr else b""
                    raise RuntimeError(f"agentflows run ended first: {error!r}")
                time.sleep(0.001)
            times.append(time.perf_counter() - started)
            process.wait(60)
    return statistics.median(times)


def import_time(statement: str, reps: int) -> float:
    """Median time a fresh interpreter takes to run ``statement`` (an import)."""
    code = f"import time\nt = time.perf_counter()\n{statement}\nprint(time.perf_counter() - t)"
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    times = []
    for _ in range(reps):
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        times.append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(times)


def _verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def main() -> None:
    """Run the three measurements and print one line each (plus the import lines)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition of each")
    options = parser.parse_args()
    reps = 1 if options.quick else 3
    server = ScriptedModelServer().start()
    try:
        parallel, sequential = asyncio.run(sub_agents(server, reps))
        print(
            f"sub-agents x{SUB_AGENTS} ({SUB_AGENT_DELAY_S:g} s each): parallel {parallel:.2f} s "
            f"(target <= {PARALLEL_TARGET_S} s: {_verdict(parallel <= PARALLEL_TARGET_S)}), "
            f"sequential {sequential:.2f} s (floor {SEQUENTIAL_FLOOR_S} s: "
            f"{_verdict(sequential >= SEQUENTIAL_FLOOR_S)}), ratio {sequential / parallel:.1f}x"
        )
        start = cold_start(server, 1 if options.quick else 5)
        print(
            f"cold start -> first model request: {start:.2f} s "
            f"(target <= {COLD_START_TARGET_S} s: {_verdict(start <= COLD_START_TARGET_S)})"
        )
    finally:
        server.stop()
    imports = {
        "import litellm": "import litellm",
        "import agentflows agent path": (
            "import agentflows.cli.main, agentflows.agents.host, agentflows.agents.openai_compat"
        ),
        "import runner extras (kube client)": (
            "import agentflows.runner.main, agentflows.kube.client, agentflows.kube.status_store"
        ),
    }
    for label, statement in imports.items():
        print(f"{label}: {import_time(statement, 1 if options.quick else 3):.2f} s")
    print(json.dumps({"parallel_s": parallel, "sequential_s": sequential, "cold_start_s": start}))


if __name__ == "__main__":
    main()

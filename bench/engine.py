"""Engine overhead benchmark: agentflows vs LangGraph 1.x, in one process, on no-op graphs.

Run ``python bench/engine.py`` (about 15 s) or ``python bench/engine.py --quick`` (about 3 s).
It measures, per executed node, the wall time of a full run of:

- ``chain-100``: 100 nodes in a line;
- ``fanout-1-32-1``: one node, 32 parallel nodes, one node that joins them (34 nodes);
- ``loop-100``: one node run 100 times by a loop (agentflows: the node and the branch that
  sends it back, 201 nodes executed with the exit; LangGraph: the node and a conditional
  edge, 100), printed per node next to ``chain-100``'s, and beside it the loop's nodes unrolled
  into a DAG (50 iterations: the same jq and a branch per iteration, no back edge), which
  parts what looping adds from what the loop's nodes do more than the chain's;

in agentflows (``compile_flow`` + ``run_flow`` with a ``MemoryStore``) and in LangGraph
(``StateGraph`` + ``ainvoke``, with an ``InMemorySaver`` and without a checkpointer). Then it
times ``agentflows run examples/hello.yaml`` from spawn to the first "node started" line.
See bench/README.md for what each side does per node.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import itertools
import operator
import os
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph

from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.engine import graph, run, store

REPO = Path(__file__).resolve().parent.parent
CHAIN_LENGTH = 100
FANOUT_WIDTH = 32
LOOP_ITERATIONS = 100
STARTUP_TARGET_S = 0.25  # issue 25
#: The CLI prints this before a node's key when the node starts (cli/main.py _Progress).
NODE_STARTED_MARK = "…"

Runner = Callable[[], Awaitable[None]]


# --- agentflows side ---------------------------------------------------------------------------

#: The per-node work: a constant jq program. The engine still builds the node's scope, runs jq
#: on it, wraps the value in the {json, text, raw} envelope and saves the node record.
AF_TRANSFORM = '="x"'


class _NoCapabilities:
    """Capabilities for flows of transforms only: any call is a bug in the benchmark."""

    async def run_agent(self, task: Any, ctx: Any) -> Any:
        raise AssertionError("no agent node in the benchmark")

    async def complete(self, task: Any, ctx: Any) -> Any:
        raise AssertionError("no llm node in the benchmark")

    async def call_tool(self, task: Any, ctx: Any) -> Any:
        raise AssertionError("no tool node in the benchmark")


def af_chain_spec(length: int) -> flow_api.FlowSpec:
    ids = [f"n{i}" for i in range(length)]
    return flow_api.FlowSpec.model_validate(
        {
            "nodes": [{"id": i, "transform": AF_TRANSFORM} for i in ids],
            "edges": [{"from": a, "to": b} for a, b in itertools.pairwise(ids)],
        }
    )


def af_fanout_spec(width: int) -> flow_api.FlowSpec:
    branches = [f"b{i}" for i in range(width)]
    return flow_api.FlowSpec.model_validate(
        {
            "nodes": [
                {"id": "start", "transform": AF_TRANSFORM},
                *({"id": b, "transform": AF_TRANSFORM} for b in branches),
                {"id": "join", "transform": AF_TRANSFORM},
            ],
            "edges": [
                *({"from": "start", "to": b} for b in branches),
                *({"from": b, "to": "join"} for b in branches),
            ],
        }
    )


def af_loop_spec(iterations: int) -> flow_api.FlowSpec:
    """``step`` counts its iterations (``.nodes.step`` is the previous one's); ``again`` loops."""
    return flow_api.FlowSpec.model_validate(
        {
            "nodes": [
                {"id": "step", "maxIterations": iterations, "transform": AF_LOOP_STEP},
                {
                    "id": "again",
                    "branch": {
                        "value": "=.nodes.step.json",
                        "cases": {str(iterations): "done"},
                        "default": "step",
                    },
                },
                {"id": "done", "transform": AF_TRANSFORM},
            ],
        }
    )


#: The loop's per-node work: the previous iteration's count plus one (jq over the run scope).
AF_LOOP_STEP = "=(.nodes.step.json // 0) + 1"
#: Iterations of the unrolled loop: its 2 nodes an iteration must fit in a Flow's node limit.
UNROLLED_ITERATIONS = LOOP_ITERATIONS // 2


def af_unrolled_spec(iterations: int) -> flow_api.FlowSpec:
    """The loop's nodes, unrolled: no back edge, the same jq and a branch per iteration.

    ``s<i>`` counts from ``s<i-1>``'s count as ``step`` does from its previous iteration's;
    ``a<i>`` branches on the count as ``again`` does (its case and default both lead on).
    """
    nodes: list[dict[str, Any]] = []
    for i in range(1, iterations + 1):
        after = f"s{i + 1}" if i < iterations else "done"
        count = f"=(.nodes.s{i - 1}.json // 0) + 1"
        nodes.append({"id": f"s{i}", "transform": count})
        branch = {"value": f"=.nodes.s{i}.json", "cases": {str(iterations): after}}
        nodes.append({"id": f"a{i}", "branch": {**branch, "default": after}})
    nodes.append({"id": "done", "transform": AF_TRANSFORM})
    return flow_api.FlowSpec.model_validate({"nodes": nodes})


def af_runner(spec: flow_api.FlowSpec, expected_nodes: int) -> Runner:
    """A full run; it must succeed with ``expected_nodes`` node executions."""
    resolver = graph.StaticResolver()
    compiled = graph.compile_flow(spec, resolver)
    caps = _NoCapabilities()

    async def once() -> None:
        memory = store.MemoryStore()
        outcome = await run.run_flow(
            compiled,
            run_name="bench",
            input_value={"name": "Ada"},
            store_=memory,
            caps=caps,
            resolver=resolver,
        )
        # attempts, not records: a loop's folded record stands for the iterations it holds
        succeeded = sum(
            r.attempts
            for r in memory.checkpoint.nodes.values()
            if r.phase == flowrun_api.NodePhase.SUCCEEDED
        )
        if outcome.phase != flowrun_api.RunPhase.SUCCEEDED or succeeded != expected_nodes:
            raise AssertionError(f"agentflows run: {outcome.phase} with {succeeded} nodes")

    return once


# --- LangGraph side ----------------------------------------------------------------------------


class ChainState(TypedDict):
    value: str


class LoopState(TypedDict):
    count: int


class FanoutState(TypedDict):
    value: str
    #: operator.add merges the 32 parallel writes of one superstep.
    results: Annotated[list[str], operator.add]


async def lg_set_value(state: Any) -> dict[str, Any]:
    """The per-node work: return a one-key update (async, so no thread pool hop)."""
    return {"value": "x"}


async def lg_append_result(state: Any) -> dict[str, Any]:
    return {"results": ["x"]}


def lg_chain_graph(length: int) -> StateGraph[Any]:
    builder = StateGraph(ChainState)
    ids = [f"n{i}" for i in range(length)]
    for node_id in ids:
        builder.add_node(node_id, lg_set_value)
    builder.add_edge(START, ids[0])
    for a, b in itertools.pairwise(ids):
        builder.add_edge(a, b)
    builder.add_edge(ids[-1], END)
    return builder


async def lg_count(state: Any) -> dict[str, Any]:
    """The loop's per-node work: the count plus one."""
    return {"count": state["count"] + 1}


def lg_loop_graph(iterations: int) -> StateGraph[Any]:
    """LangGraph's own cycle: ``step`` and a conditional edge back to it until the count."""
    builder = StateGraph(LoopState)
    builder.add_node("step", lg_count)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", lambda s: END if s["count"] >= iterations else "step")
    return builder


def lg_fanout_graph(width: int) -> StateGraph[Any]:
    builder = StateGraph(FanoutState)
    branches = [f"b{i}" for i in range(width)]
    builder.add_node("start", lg_set_value)
    for b in branches:
        builder.add_node(b, lg_append_result)
        builder.add_edge("start", b)
    builder.add_node("join", lg_set_value)
    builder.add_edge(START, "start")
    builder.add_edge(branches, "join")  # join waits for every branch
    builder.add_edge("join", END)
    return builder


def lg_runner(
    builder: StateGraph[Any], initial: dict[str, Any], check: Callable[[Any], bool], saver: bool
) -> Runner:
    checkpointer = InMemorySaver() if saver else None
    app = builder.compile(checkpointer=checkpointer)

    async def once() -> None:
        thread_id = uuid.uuid4().hex
        config: Any = {"recursion_limit": 1000, "configurable": {"thread_id": thread_id}}
        # durability="sync": each step's checkpoint is saved before the next step starts,
        # the guarantee agentflows gives (a node's record is stored before its dependants run).
        kwargs: dict[str, Any] = {"durability": "sync"} if saver else {}
        result = await app.ainvoke(dict(initial), config, **kwargs)
        if checkpointer is not None:
            checkpointer.delete_thread(thread_id)  # keep memory flat across repetitions
        if not check(result):
            raise AssertionError(f"langgraph run: unexpected result {result!r}")

    return once


# --- measuring ---------------------------------------------------------------------------------


async def measure(
    runners: dict[str, Runner], reps: int | None, budget_s: float, warmup: int
) -> dict[str, list[float]]:
    """Wall times of full runs of each runner, after warm-up.

    Runs are interleaved round-robin so that load from other processes hits every engine
    alike. ``reps=None`` gives each runner as many runs as fit in ``budget_s``.
    """
    counts: dict[str, int] = {}
    for name, once in runners.items():
        for _ in range(warmup):
            await once()
        one = 1.0
        for _ in range(3):  # the fastest of three: one slow outlier must not set the count
            started = time.perf_counter()
            await once()
            one = min(one, time.perf_counter() - started)
        counts[name] = reps if reps is not None else max(5, min(2000, int(budget_s / one)))
    times: dict[str, list[float]] = {name: [] for name in runners}
    for index in range(max(counts.values())):
        for name, once in runners.items():
            if index < counts[name]:
                started = time.perf_counter()
                await once()
                times[name].append(time.perf_counter() - started)
    return times


def per_node_us(times: list[float], nodes: int) -> tuple[float, float]:
    """(median, p90) of microseconds per node."""
    per = sorted(t / nodes * 1e6 for t in times)
    p90 = per[min(len(per) - 1, round(0.9 * (len(per) - 1)))]
    return statistics.median(per), p90


def profile_agentflows(once: Runner, reps: int, limit: int) -> str:
    """cProfile ``reps`` agentflows runs; the top functions by own time, then by cumulative."""
    profiler = cProfile.Profile()

    async def many() -> None:
        for _ in range(reps):
            await once()

    profiler.enable()
    asyncio.run(many())
    profiler.disable()
    lines = []
    for key in ("tottime", "cumulative"):
        stats = pstats.Stats(profiler)
        stats.sort_stats(key)
        rows = []
        for func in stats.fcn_list or []:  # type: ignore[attr-defined]
            _, _, tt, ct, _ = stats.stats[func]  # type: ignore[attr-defined]
            name = f"{Path(func[0]).name}:{func[1]}({func[2]})"
            if key == "cumulative" and "agentflows" not in func[0]:
                continue
            rows.append(f"    {tt / reps * 1e3:8.3f} ms own  {ct / reps * 1e3:8.3f} ms cum  {name}")
            if len(rows) == limit:
                break
        label = "own time" if key == "tottime" else "cumulative (agentflows code)"
        lines.append(f"  top {limit} by {label}, per run:")
        lines.extend(rows)
    return "\n".join(lines)


# --- CLI start-up ------------------------------------------------------------------------------


def cli_command() -> list[str]:
    script = shutil.which("agentflows")
    if script is not None:
        return [script]
    return [sys.executable, "-c", "from agentflows.cli.main import main; main()"]


def time_to_first_node(command: list[str]) -> float:
    """Seconds from spawning ``agentflows run`` until it prints its first node-started line."""
    with tempfile.TemporaryDirectory() as state_dir:
        args = [*command, "run", "examples/hello.yaml", "--input", "name=Ada"]
        args += ["--state-dir", state_dir]
        env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
        # Timed as a user starts it: with the bytecode caches pip writes at install (or the
        # first run writes, for an editable install), not recompiling every module each time.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        started = time.perf_counter()
        proc = subprocess.Popen(
            args,
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
        )
        assert proc.stderr is not None
        seen: list[str] = []
        first: float | None = None
        for line in proc.stderr:
            if first is None and NODE_STARTED_MARK in line:
                first = time.perf_counter() - started
            seen.append(line)
        proc.wait()
        if first is None:
            raise RuntimeError(
                f"agentflows run printed no node-started line (exit {proc.returncode}):\n"
                + "".join(seen[-20:])
            )
        return first


_IMPORT_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \| ( *)(\S+)")


def import_times(command: list[str]) -> list[tuple[int, str, str, float, float]]:
    """(depth, module, importer, self ms, cumulative ms) of the imports before the first node."""
    with tempfile.TemporaryDirectory() as state_dir:
        code = "from agentflows.cli.main import main; main()"
        args = [sys.executable, "-X", "importtime", "-c", code]
        args += ["run", "examples/hello.yaml", "--input", "name=Ada", "--state-dir", state_dir]
        proc = subprocess.run(
            args, cwd=REPO, capture_output=True, text=True, encoding="utf-8", check=False
        )
    entries = []
    for line in proc.stderr.splitlines():
        if NODE_STARTED_MARK in line:
            break  # importtime and progress share stderr: keep what precedes the first node
        match = _IMPORT_LINE.match(line)
        if match:
            own, cumulative, indent, name = match.groups()
            entries.append((len(indent) // 2, name, int(own) / 1e3, int(cumulative) / 1e3))
    # importtime prints a module after the modules it imports: the importer of an entry is the
    # next entry printed at a smaller depth.
    rows = []
    for index, (depth, name, own, cumulative) in enumerate(entries):
        importer = next((e[1] for e in entries[index + 1 :] if e[0] < depth), "")
        rows.append((depth, name, importer, own, cumulative))
    return rows


def print_slowest_imports(command: list[str], limit: int) -> None:
    """The imports that cost most: by own time, and third-party ones agentflows imports."""
    rows = import_times(command)
    print(f"slowest imports before the first node, top {limit} by own time (ms own / cumulative):")
    for _, name, importer, own, cumulative in sorted(rows, key=lambda r: -r[3])[:limit]:
        print(f"  {own:7.1f} / {cumulative:7.1f}  {name} (imported by {importer or 'startup'})")
    direct = [
        r for r in rows if r[2].startswith("agentflows") and not r[1].startswith("agentflows")
    ]
    print(f"top {limit} libraries imported by agentflows modules, by cumulative time:")
    for _, name, importer, own, cumulative in sorted(direct, key=lambda r: -r[4])[:limit]:
        print(f"  {own:7.1f} / {cumulative:7.1f}  {name} (imported by {importer})")


# --- main --------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a ~3 s smoke run")
    parser.add_argument("--reps", type=int, default=None, help="repetitions per measurement")
    parser.add_argument("--profile", action="store_true", help="profile agentflows regardless")
    options = parser.parse_args()
    budget = 0.1 if options.quick else 2.0  # seconds per (graph, engine) measurement
    warmup = 1 if options.quick else 10
    startup_runs = 1 if options.quick else 5

    # (name, nodes agentflows executes, nodes LangGraph executes, spec, graph, input, check)
    cases: list[
        tuple[
            str,
            int,
            int,
            Any,
            Callable[[], StateGraph[Any]],
            dict[str, Any],
            Callable[[Any], bool],
        ]
    ] = [
        (
            f"chain-{CHAIN_LENGTH}",
            CHAIN_LENGTH,
            CHAIN_LENGTH,
            af_chain_spec(CHAIN_LENGTH),
            lambda: lg_chain_graph(CHAIN_LENGTH),
            {"value": ""},
            lambda r: r["value"] == "x",
        ),
        (
            f"fanout-1-{FANOUT_WIDTH}-1",
            FANOUT_WIDTH + 2,
            FANOUT_WIDTH + 2,
            af_fanout_spec(FANOUT_WIDTH),
            lambda: lg_fanout_graph(FANOUT_WIDTH),
            {"value": "", "results": []},
            lambda r: r["value"] == "x" and len(r["results"]) == FANOUT_WIDTH,
        ),
        (
            f"loop-{LOOP_ITERATIONS}",
            2 * LOOP_ITERATIONS + 1,
            LOOP_ITERATIONS,
            af_loop_spec(LOOP_ITERATIONS),
            lambda: lg_loop_graph(LOOP_ITERATIONS),
            {"count": 0},
            lambda r: r["count"] == LOOP_ITERATIONS,
        ),
    ]
    print("per node, agentflows: a transform node '=\"x\"' (jq over the run scope, output")
    print("  envelope, node record saved to a MemoryStore); LangGraph: an async function")
    print("  returning a one-key dict update (a list append merged by operator.add in the")
    print("  fan-out), with InMemorySaver (durability=sync) and without a checkpointer.")
    rows = []
    slow: list[tuple[str, Runner]] = []

    async def measure_all() -> None:
        for name, af_nodes, lg_nodes, spec, make_graph, initial, check in cases:
            af = af_runner(spec, af_nodes)
            engines = {
                "agentflows": af,
                "langgraph+saver": lg_runner(make_graph(), initial, check, saver=True),
                "langgraph": lg_runner(make_graph(), initial, check, saver=False),
            }
            times = await measure(engines, options.reps, budget, warmup)
            executed = {"agentflows": af_nodes}
            stats = {
                e: (*per_node_us(t, executed.get(e, lg_nodes)), len(t)) for e, t in times.items()
            }
            ratio = stats["agentflows"][0] / stats["langgraph+saver"][0]
            rows.append((name, stats, ratio))
            if ratio > 1.0 or options.profile:
                slow.append((name, af))
        # loop vs chain, per node, measured interleaved (the rows above come minutes apart,
        # under whatever load the machine had then)
        paired = {
            "agentflows loop": af_runner(af_loop_spec(LOOP_ITERATIONS), 2 * LOOP_ITERATIONS + 1),
            "agentflows chain": af_runner(af_chain_spec(LOOP_ITERATIONS), LOOP_ITERATIONS),
            "agentflows unrolled": af_runner(
                af_unrolled_spec(UNROLLED_ITERATIONS), 2 * UNROLLED_ITERATIONS + 1
            ),
            "langgraph+saver loop": lg_runner(
                lg_loop_graph(LOOP_ITERATIONS),
                {"count": 0},
                lambda r: r["count"] == LOOP_ITERATIONS,
                saver=True,
            ),
            "langgraph+saver chain": lg_runner(
                lg_chain_graph(LOOP_ITERATIONS), {"value": ""}, lambda r: r["value"] == "x", True
            ),
        }
        times = await measure(paired, options.reps, budget, warmup)
        executed = {
            "agentflows loop": 2 * LOOP_ITERATIONS + 1,
            "agentflows unrolled": 2 * UNROLLED_ITERATIONS + 1,
        }
        loop_vs_chain.update(
            {e: per_node_us(t, executed.get(e, LOOP_ITERATIONS))[0] for e, t in times.items()}
        )

    loop_vs_chain: dict[str, float] = {}
    asyncio.run(measure_all())
    time_to_first_node(cli_command())  # not counted: writes the bytecode caches, as pip does
    startup = [time_to_first_node(cli_command()) for _ in range(startup_runs)]
    startup_s = statistics.median(startup)

    def cell(stat: tuple[float, float, int]) -> str:
        return f"{stat[0]:8.1f} / {stat[1]:8.1f}"

    print()
    print("µs per node, median / p90 over repetitions (reps: af, lg+saver, lg)")
    header = f"{'graph':<16}{'agentflows':>21}{'langgraph (saver)':>23}"
    header += f"{'langgraph (none)':>23}{'ratio':>8}   reps"
    print(header)
    for name, stats, ratio in rows:
        reps = "/".join(str(s[2]) for s in stats.values())
        print(
            f"{name:<16}{cell(stats['agentflows']):>21}{cell(stats['langgraph+saver']):>23}"
            f"{cell(stats['langgraph']):>23}{ratio:>8.2f}   {reps}"
        )
    print("ratio = agentflows / langgraph with checkpointer, medians (target <= 1.0)")
    af_loop, af_chain = loop_vs_chain["agentflows loop"], loop_vs_chain["agentflows chain"]
    lg_loop, lg_chain = (
        loop_vs_chain["langgraph+saver loop"],
        loop_vs_chain["langgraph+saver chain"],
    )
    af_per_iteration = af_loop * (2 * LOOP_ITERATIONS + 1) / LOOP_ITERATIONS
    print(
        f"loop-{LOOP_ITERATIONS} per node / chain-{LOOP_ITERATIONS} per node, measured"
        f" interleaved (medians; target ~1.0): agentflows {af_loop / af_chain:.2f}"
        f" ({af_loop:.1f} / {af_chain:.1f} µs), langgraph+saver {lg_loop / lg_chain:.2f}"
        f" ({lg_loop:.1f} / {lg_chain:.1f} µs); loop ratio agentflows / langgraph+saver"
        f" {af_loop / lg_loop:.2f} per node, {af_per_iteration / lg_loop:.2f} per iteration"
    )
    af_unrolled = loop_vs_chain["agentflows unrolled"]
    print(
        f"  agentflows, the loop's nodes unrolled ({UNROLLED_ITERATIONS} iterations, no back"
        f" edge; {af_unrolled:.1f} µs per node): loop / unrolled {af_loop / af_unrolled:.2f}"
        f" (what looping adds), unrolled / chain {af_unrolled / af_chain:.2f} (the loop's"
        " nodes' work against the chain's constant)"
    )
    print(
        f"  nodes executed in loop-{LOOP_ITERATIONS}: agentflows {2 * LOOP_ITERATIONS + 1} (the"
        f" node, the branch that sends it back, the exit), langgraph {LOOP_ITERATIONS} (its"
        " conditional edge is no node)"
    )
    verdict = "ok" if startup_s <= STARTUP_TARGET_S else "OVER TARGET"
    print(
        f"cli start -> first node: {startup_s:.2f} s (target <= {STARTUP_TARGET_S} s, {verdict};"
        f" median of {startup_runs}: {', '.join(f'{s:.2f}' for s in startup)})"
    )
    if startup_s > STARTUP_TARGET_S:
        print_slowest_imports(cli_command(), 5)
    if not options.quick:
        for name, once in slow:
            print(f"\nagentflows profile, {name} (ratio > 1 or --profile):")
            print(profile_agentflows(once, 20, 12))


if __name__ == "__main__":
    main()

"""What a picture of a flow holds, before it is written as Mermaid or DOT.

:func:`build` turns a Flow spec (and, for a run, its ``status.nodes`` records) into boxes,
groups and links; :mod:`agentflows.diagram.mermaid_text` and :mod:`agentflows.diagram.dot_text`
only write them out. Text in a shape is raw (the writers escape it), and every element has a
generated key (``n0``, ``n1``, ...) so no id, name or case value from a Flow ever becomes an
identifier in the output.

- A node is a box labelled with its id and kind (and what it calls: an agent, a model, a tool).
- A ``map`` node is a group holding its body: one box for an agent or tool body, or the
  sub-flow's nodes for a flow body. A ``flow`` node is a group holding the sub-flow's nodes,
  when the sub-flow is known (``flows``); otherwise a box. Sub-flows are drawn to the engine's
  depth limit, and a sub-flow that calls itself is drawn once.
- Edges are the engine's (:func:`agentflows.engine.graph.edges`); an edge out of a branch node
  is labelled with the case values (and ``default``) that take it. An edge that goes back (a
  loop's back edge, :func:`agentflows.engine.loops.back_edges`) carries the loop's bound
  (``maxIterations`` of the node it re-enters, else the Flow's limit) and is drawn dotted.
- For a run, each element has the phase of its status record and its duration. Status keys
  are the engine's: ``id``, ``map[3]`` for a map item, ``sub/id`` inside a sub-flow; the body
  of a map has the phases of all its items, summed up (``3 items: 2 Succeeded, 1 Running``).
  A node not finished yet shows the time so far (``Waiting for 3m12s``). A node of a loop
  shows its latest iteration (``id#<n>``) and how many it ran (``iteration 3``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import pydantic

from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.api import times
from agentflows.engine import graph, loops

#: A run's ``status.nodes``: typed records, or their wire JSON as read from the API.
NodesStatus = Mapping[str, flowrun_api.NodeStatus | Mapping[str, Any]]

#: How deep sub-flows are drawn: the engine's own limit on sub-flow calls.
MAX_DEPTH = 5
#: Most boxes in one picture; sub-flows past it are drawn as a single box.
MAX_BOXES = 2000
#: Longest piece of user text in a label; longer text is cut with an ellipsis.
MAX_TEXT = 60
#: Which phase a summed-up map body shows when its items differ: the first one present.
_PHASE_ORDER = (
    flowrun_api.NodePhase.FAILED,
    flowrun_api.NodePhase.RUNNING,
    flowrun_api.NodePhase.WAITING,
    flowrun_api.NodePhase.SUCCEEDED,
    flowrun_api.NodePhase.SKIPPED,
)
#: The phase of an element that has no record yet in a run's status.
PENDING = "Pending"


@dataclasses.dataclass
class Box:
    """One drawn node: label lines and, in a run, its phase."""

    key: str
    lines: list[str]
    phase: str | None = None


@dataclasses.dataclass
class Group:
    """A map body or a sub-flow: a titled frame around its own elements and links."""

    key: str
    title: str
    children: list[Box | Group]
    links: list[Link]
    phase: str | None = None

    def entry(self) -> Box:
        """The box an edge into the group points at (its first element's)."""
        first = self.children[0]
        return first if isinstance(first, Box) else first.entry()

    def exit(self) -> Box:
        """The box an edge out of the group leaves from: its last element that no link leaves."""
        leaving = {id(link.source) for link in self.links}
        last = next(c for c in reversed(self.children) if id(c) not in leaving)
        return last if isinstance(last, Box) else last.exit()


@dataclasses.dataclass
class Link:
    """An edge between two elements (boxes or groups) of the same level."""

    source: Box | Group
    target: Box | Group
    label: str | None = None
    #: A loop's back edge: the most iterations of the loop it re-enters (else None).
    loop_bound: int | None = None


@dataclasses.dataclass
class Picture:
    """A whole flow: its top-level elements and links, and whether phases are shown."""

    children: list[Box | Group]
    links: list[Link]
    run: bool


@dataclasses.dataclass
class _Record:
    """What is shown of one or several status records."""

    phase: str
    #: Seconds taken, and whether it is over (else: so far).
    span: tuple[float, bool] | None
    counts: dict[str, int]
    #: Iterations recorded of a node in a loop (1 outside loops).
    iterations: int = 1


def short(text: str) -> str:
    """``text`` on one line and cut to :data:`MAX_TEXT` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_TEXT else flat[: MAX_TEXT - 1] + "…"


def took(seconds: float) -> str:
    """A node's duration: hundredths under a minute (as ``agentflows get``), else 1h2m3s."""
    if seconds < 60:
        return f"{seconds:.2f}s"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes}m{secs}s" if hours else f"{minutes}m{secs}s"


#: The fields of a status record a picture shows; others (outputs, fields of newer runners)
#: are not read, so a record a newer agentflows wrote still draws.
_SHOWN_FIELDS = ("phase", "startedAt", "finishedAt")


def _typed(record: flowrun_api.NodeStatus | Mapping[str, Any]) -> flowrun_api.NodeStatus | None:
    """The record's phase and times, typed; None when they are not a record's (drawn Pending)."""
    if isinstance(record, flowrun_api.NodeStatus):
        return record
    try:
        return flowrun_api.NodeStatus.model_validate(
            {k: record[k] for k in _SHOWN_FIELDS if k in record}
        )
    except pydantic.ValidationError:
        return None


def _span(records: list[flowrun_api.NodeStatus]) -> tuple[float, bool] | None:
    """Seconds from the first start to the last finish (or to now), and whether all finished."""
    starts = [times.parse_time(r.started_at) for r in records if r.started_at]
    ends = [times.parse_time(r.finished_at) for r in records if r.finished_at]
    aware = [t for t in (*starts, *ends) if t is not None]
    if not starts or len(aware) < len(starts) + len(ends):
        return None
    finished = len(ends) == len(records)
    end = max(aware[len(starts) :]) if finished else times.now()
    return max(0.0, (end - min(aware[: len(starts)])).total_seconds()), finished


class _Builder:
    """Walks a flow and its sub-flows into elements, numbering keys as it goes."""

    def __init__(self, flows: Mapping[str, flow_api.FlowSpec], status: NodesStatus | None):
        self.flows = flows
        self.run = status is not None
        typed = {key: _typed(record) for key, record in (status or {}).items()}
        self.status = {key: record for key, record in typed.items() if record is not None}
        self.count = 0

    def key(self) -> str:
        self.count += 1
        return f"n{self.count - 1}"

    def record(self, status_key: str) -> _Record | None:
        """What the status holds for a key; ``[*]`` in it stands for every map item."""
        if not self.run:
            return None
        iterations = 1
        if "[*]" not in status_key:
            latest, iterations = self.latest(status_key)
            found = self.status.get(latest)
            records = [found] if found is not None else []
        else:
            pattern = re.compile(re.escape(status_key).replace(r"\[\*\]", r"\[\d+\]") + "$")
            records = [r for k, r in self.status.items() if pattern.match(k)]
        if not records:
            return _Record(PENDING, None, {})
        counts: dict[str, int] = {}
        for r in records:
            counts[r.phase.value] = counts.get(r.phase.value, 0) + 1
        phase = next(p for p in (*_PHASE_ORDER, *counts) if p in counts)
        return _Record(phase, _span(records), counts, iterations)

    def latest(self, status_key: str) -> tuple[str, int]:
        """The key of a node's latest iteration (``id#<n>``, the engine's) and its number."""
        n = flowrun_api.latest_iteration(self.status, status_key)
        return (f"{status_key}#{n}" if n > 1 else status_key), n

    def flow(
        self, spec: flow_api.FlowSpec, prefix: str, chain: tuple[str, ...]
    ) -> tuple[list[Box | Group], list[Link]]:
        """The elements and links of one (sub-)flow whose status keys start with ``prefix``."""
        elements: dict[str, Box | Group] = {}
        for node in spec.nodes:
            if node.id not in elements:
                elements[node.id] = self.node(node, prefix, chain)
        by_id = {n.id: n for n in reversed(spec.nodes)}
        edges = graph.edges(spec)
        successors: dict[str, list[str]] = {}
        for edge in edges:
            successors.setdefault(edge.source, []).append(edge.target)
        backs = set(loops.back_edges(spec.nodes[0].id, successors))
        links = [
            Link(
                elements[e.source],
                elements[e.target],
                _branch_label(by_id[e.source], e.target),
                (by_id[e.target].max_iterations or spec.limits.max_iterations)
                if (e.source, e.target) in backs
                else None,
            )
            for e in edges
        ]
        return list(elements.values()), links

    def node(self, node: flow_api.Node, prefix: str, chain: tuple[str, ...]) -> Box | Group:
        status_key = prefix + node.id
        shown = self.record(status_key)
        call = node.flow or (node.map.flow if node.map else None)
        sub = self.flows.get(call.name) if call is not None else None
        expand = (
            call is not None
            and sub is not None
            and call.name not in chain
            and len(chain) < MAX_DEPTH
            and self.count < MAX_BOXES
        )
        if node.map is None and not expand:
            return Box(self.key(), [node.id, _kind(node), *_phase_lines(shown)], _phase(shown))
        key = self.key()
        title = " · ".join([node.id, _kind(node), *_phase_lines(shown)])
        if expand and call is not None and sub is not None:
            latest = self.latest(status_key)[0]
            inner = f"{latest}[*]/" if node.map is not None else f"{latest}/"
            children, links = self.flow(sub, inner, (*chain, call.name))
            return Group(key, title, children, links, _phase(shown))
        assert node.map is not None
        body = self.record(f"{self.latest(status_key)[0]}[*]")
        lines = [_map_body(node.map), *_item_lines(body)]
        return Group(key, title, [Box(self.key(), lines, _phase(body))], [], _phase(shown))


def _phase(shown: _Record | None) -> str | None:
    return None if shown is None else shown.phase


def _phase_lines(shown: _Record | None) -> list[str]:
    if shown is None:
        return []
    loop = [f"iteration {shown.iterations}"] if shown.iterations > 1 else []
    if shown.span is None:
        return [shown.phase, *loop]
    seconds, finished = shown.span
    took_text = took(seconds)
    return [f"{shown.phase} {took_text}" if finished else f"{shown.phase} for {took_text}", *loop]


def loop_label(link: Link) -> str | None:
    """A link's label for the writers: its case values, and ``loop, max N`` on a back edge."""
    parts = [link.label] if link.label else []
    if link.loop_bound is not None:
        parts.append(f"loop, max {link.loop_bound}")
    return " · ".join(parts) or None


def _item_lines(body: _Record | None) -> list[str]:
    """A map body's items, summed up: ``3 items: 2 Succeeded, 1 Running``."""
    if body is None:
        return []
    if not body.counts:
        return [PENDING]
    total = sum(body.counts.values())
    parts = ", ".join(f"{n} {p}" for p, n in body.counts.items())
    return [f"{total} item{'s' if total != 1 else ''}: {parts}"]


def _branch_label(source: flow_api.Node, target: str) -> str | None:
    """The case values (and ``default``) of a branch node that lead to ``target``."""
    if source.branch is None:
        return None
    cases = [value for value, to in source.branch.cases.items() if to == target]
    if source.branch.default == target:
        cases.append(graph.DEFAULT_CASE)
    return " | ".join(short(c) for c in cases) or None


def _tool(tool: flow_api.ToolCall) -> str:
    if tool.agent is not None:
        return f"tool {short(tool.name or '')} of {tool.agent}"
    inline = next(k for k in ("http", "python", "client", "mcp") if getattr(tool, k) is not None)
    return f"tool {inline}" + (f" {short(tool.name)}" if tool.name else "")


def _map_body(body: flow_api.MapNode) -> str:
    if body.agent is not None:
        return f"each item: agent {body.agent.name}"
    if body.tool is not None:
        return f"each item: {_tool(body.tool)}"
    assert body.flow is not None
    return f"each item: flow {body.flow.name}"


def _kind(node: flow_api.Node) -> str:
    """The node's kind, with what it calls."""
    if node.agent is not None:
        return f"agent {node.agent.name}"
    if node.llm is not None:
        return f"llm {short(node.llm.model.name)}"
    if node.tool is not None:
        return _tool(node.tool)
    if node.flow is not None:
        return f"flow {node.flow.name}"
    if node.map is not None:
        return "map" + (f" flow {node.map.flow.name}" if node.map.flow is not None else "")
    return node.kind


def build(
    spec: flow_api.FlowSpec,
    nodes_status: NodesStatus | None = None,
    flows: Mapping[str, flow_api.FlowSpec] | None = None,
) -> Picture:
    """The picture of ``spec`` (with phases when ``nodes_status`` is given, even empty)."""
    builder = _Builder(flows or {}, nodes_status)
    children, links = builder.flow(spec, "", ())
    return Picture(children, links, builder.run)

"""A run's page body: summary, graph, nodes (output, error, tool calls, usage), log, Events.

Pure rendering of a FlowRun object (a cluster's or a local run's): the handlers fetch, this
module shows. Outputs, errors, tool arguments and log lines are untrusted text, shown escaped.
Elements that follow the run live carry ``data-node`` (and ``data-field``) for the script.
"""

from __future__ import annotations

from typing import Any

import pydantic

from agentflows.api import common
from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.console import markup, runs_view
from agentflows.engine import graph as graph_mod
from agentflows.engine import loops

#: What a node's input section says it shows (a node record keeps no evaluated input).
INPUT_NOTE = "no evaluated input is recorded: these are the outputs of the nodes it reads"
#: What a folded record's section says it is (engine/loops.py folds a long loop's iterations).
FOLDED_NOTE = (
    "these iterations are folded into one record: their attempts and usage summed, the output "
    "of the latest that succeeded; the others' outputs are not kept"
)


Status = flowrun_api.FlowRunStatus
Records = dict[str, flowrun_api.NodeStatus]


def _usage(usage: common.Usage | None) -> str:
    if usage is None:
        return ""
    parts = [
        f"{usage.prompt_tokens} prompt + {usage.completion_tokens} completion",
        f"{usage.llm_calls} model call(s)",
        f"{usage.tool_calls} tool call(s)",
        f"${usage.cost_usd:.4f}",
    ]
    return ", ".join(parts)


def summary(run: dict[str, Any], status: Status | None = None) -> markup.Html:
    """The run's facts: flow, phase, trigger, times, usage, message, input and output.

    ``status``: the run's, when the caller has parsed it already (so do :func:`graph` and
    :func:`nodes`).
    """
    status = status if status is not None else flowrun_api.status_of(run)
    cells = runs_view.row(run, status)
    facts = [
        ("Flow", cells["flow"]),
        ("Phase", markup.tag("span", markup.phase(cells["phase"]), data_field="run-phase")),
        ("Trigger", cells["trigger"]),
        ("Started", cells["started"]),
        ("Duration", cells["duration"]),
        ("Attempt", str(status.attempt or "")),
        ("Usage", _usage(status.usage)),
        ("Message", status.message or ""),
        ("Input", markup.json_block((run.get("spec") or {}).get("input"))),
        ("Output", _output(status.output, status.output_ref, None)),
    ]
    items = markup.join(markup.join([markup.tag("dt", k), markup.tag("dd", v)]) for k, v in facts)
    return markup.tag("dl", items, class_="facts")


def _output(value: Any, ref: Any, fetch_href: str | None) -> markup.Html:
    if ref and fetch_href:
        return markup.join(
            [markup.json_block(value), markup.link(fetch_href, "Fetch the whole output")]
        )
    return markup.json_block(value)


def node_order(
    run: dict[str, Any], flow_spec: dict[str, Any] | None, status: Status | None = None
) -> list[str]:
    """Node ids in the Flow's order, each followed by its other records, then any others.

    A node's other records: its loop iterations in turn (``review#2`` before ``review#10``),
    its map items, the steps of its sub-flow.
    """
    status = status if status is not None else flowrun_api.status_of(run)
    declared = list(
        dict.fromkeys(
            str(n.get("id")) for n in (flow_spec or {}).get("nodes") or [] if isinstance(n, dict)
        )
    )
    position = {node_id: index for index, node_id in enumerate(declared)}
    recorded = status.nodes.keys()

    def order(key: str) -> tuple[int, list[str | int]]:
        base = flowrun_api.node_of_key(key)[0]
        return position.get(base, len(declared)), flowrun_api.key_order(key)

    return sorted([*declared, *(k for k in recorded if k not in position)], key=order)


def definition_id(key: str) -> str:
    """The node id a record key is an iteration of (``review#2``, ``review#2-990``: ``review``).

    Any other key (a map item, a sub-flow step) is its own.
    """
    base, iteration = flowrun_api.node_of_key(key)
    folded = flowrun_api.folded_range(key)
    return base if key == f"{base}#{iteration}" or (folded and folded[0] == base) else key


def iteration_keys(records: Records, node_id: str) -> list[str]:
    """A node's records of its loop iterations in turn: ``review``, ``review#2-990``, ...

    None for a node that has only one record (it is not in a loop, or in its first iteration).
    """
    keys = [k for k in records if k != node_id and definition_id(k) == node_id]
    if not keys:
        return []
    return [node_id, *sorted(keys, key=flowrun_api.key_order)]


def _iterations(records: Records, node_id: str) -> markup.Html:
    """A table of a node's iterations: number, record, phase, time taken, usage.

    Each row carries ``data-node`` so that the live updates keep its phase and time current.
    """
    rows = []
    for key in iteration_keys(records, node_id):
        record = records.get(key)
        folded = flowrun_api.folded_range(key)
        number = f"{folded[1]} to {folded[2]}" if folded else str(flowrun_api.node_of_key(key)[1])
        shown = markup.phase(record.phase.value if record else None)
        phase = markup.tag("span", shown, data_field="phase")
        if folded:
            detail = record.detail if record and isinstance(record.detail, dict) else {}
            counts = detail.get("folded") or {}
            told = ", ".join(f"{n} {what}" for what, n in sorted(counts.items()))
            phase = markup.join([phase, " ", markup.tag("span", f"folded: {told}", class_="muted")])
        # a fold spans many iterations: no one iteration's time (and no live update of it)
        took = (
            ""
            if folded
            else markup.tag("span", runs_view.node_duration(record), data_field="duration")
        )
        cells = [number, key, phase, took, _usage(record.usage if record else None)]
        rows.append(markup.row_of(cells, data_node=key))
    header = ("Iteration", "Record", "Phase", "Took", "Usage")
    return markup.table(header, rows, class_="iterations", data_iterations=node_id)


def graph(
    run: dict[str, Any], flow_spec: dict[str, Any] | None, status: Status | None = None
) -> markup.Html:
    """The run's nodes as a chain of phase badges that the script keeps current."""
    status = status if status is not None else flowrun_api.status_of(run)
    items = []
    for node in node_order(run, flow_spec, status):
        badge = markup.tag("span", markup.phase(_phase(status.nodes.get(node))), data_field="phase")
        items.append(markup.tag("li", markup.join([node, " ", badge]), data_node=node))
    return markup.tag("ol", markup.join(items), class_="graph", id="graph")


def _phase(record: flowrun_api.NodeStatus | None) -> str:
    """A node's phase as shown: Pending before it has a record."""
    return record.phase.value if record else flowrun_api.RunPhase.PENDING.value


def _tool_calls(detail: Any) -> markup.Html:
    calls = detail.get("toolCalls") if isinstance(detail, dict) else None
    if not calls:
        return markup.Html("")
    rows = [
        (
            c.get("name", ""),
            c.get("status", ""),
            c.get("startedAt", ""),
            f"{c['durationMs']} ms" if "durationMs" in c else "",
            c.get("error") or "",
        )
        for c in calls
        if isinstance(c, dict)
    ]
    return markup.table(("Tool", "Status", "Started", "Took", "Error"), rows, class_="calls")


def upstream(flow_spec: dict[str, Any] | None) -> dict[str, list[tuple[str, bool]]]:
    """Each node's upstream nodes by the edges the engine runs the Flow by (none when unknown).

    Each with whether its edge goes back (a loop's back edge feeds the next iteration).
    """
    try:
        spec = flow_api.FlowSpec.model_validate(flow_spec or {})
    except pydantic.ValidationError:
        return {}
    edges = graph_mod.edges(spec)
    successors: dict[str, list[str]] = {}
    for edge in edges:
        successors.setdefault(edge.source, []).append(edge.target)
    backs = set(loops.back_edges(spec.nodes[0].id, successors)) if spec.nodes else set()
    found: dict[str, list[tuple[str, bool]]] = {}
    for edge in edges:
        back = (edge.source, edge.target) in backs
        found.setdefault(edge.target, []).append((edge.source, back))
    return found


def _source_key(records: Records, source: str, iteration: int) -> str:
    """The record of ``source`` that an iteration read: its latest one up to that iteration.

    An iteration folded away is read from its fold, which keeps the latest output it held.
    """
    for n in range(iteration, 1, -1):
        if f"{source}#{n}" in records:
            return f"{source}#{n}"
        fold = flowrun_api.fold_holding(records, f"{source}#{n}")
        if fold is not None:
            return fold
    return source


def _inputs(
    run: dict[str, Any], records: Records, node: str, sources: list[tuple[str, bool]] | None
) -> markup.Html:
    """The node's input as far as the status tells: its sources' outputs."""
    if sources is None:
        unknown = "unknown (no Flow definition to read its edges from)"
        return markup.tag("span", unknown, class_="muted")
    if not sources:
        shown = [("the run's input (.run.input)", (run.get("spec") or {}).get("input"))]
    else:
        iteration = flowrun_api.node_of_key(node)[1]
        keys = [(s, _source_key(records, s, iteration - back)) for s, back in sources]
        shown = [(f"output of {key} (.nodes.{s})", _output_of(records.get(key))) for s, key in keys]
    items = markup.join(
        markup.join([markup.tag("dt", label), markup.tag("dd", markup.json_block(value))])
        for label, value in shown
    )
    note = markup.tag("p", INPUT_NOTE, class_="muted")
    return markup.join([note, markup.tag("dl", items, class_="inputs", data_inputs=node)])


def _output_of(record: flowrun_api.NodeStatus | None) -> Any:
    return record.output if record else None


def nodes(
    run: dict[str, Any],
    flow_spec: dict[str, Any] | None,
    output_href: Any,
    status: Status | None = None,
) -> markup.Html:
    """A section per node: phase, duration, definition, input, output, error, tool calls, usage.

    ``output_href(node)``: where an offloaded output is fetched from (None: nowhere).
    """
    status = status if status is not None else flowrun_api.status_of(run)
    records = status.nodes
    definitions = {
        str(n.get("id")): n for n in (flow_spec or {}).get("nodes") or [] if isinstance(n, dict)
    }
    sources = upstream(flow_spec) if flow_spec else None
    sections = []
    for node in node_order(run, flow_spec, status):
        record = records.get(node)
        head = markup.join(
            [
                markup.tag("h3", node),
                markup.tag("span", markup.phase(_phase(record)), data_field="phase"),
                markup.tag(
                    "span", runs_view.node_duration(record), data_field="duration", class_="muted"
                ),
            ]
        )
        node_id = definition_id(node)
        facts = [("Definition", markup.json_block(definitions.get(node_id)))]
        if node == node_id and iteration_keys(records, node_id):
            facts.append(("Iterations", _iterations(records, node_id)))
        if flowrun_api.folded_range(node) is not None:
            facts.append(("Folded", markup.tag("p", FOLDED_NOTE, class_="muted")))
        elif node_id in definitions:
            reads = None if sources is None else sources.get(node_id, [])
            facts.append(("Input", _inputs(run, records, node, reads)))
        facts += _record_facts(node, record, output_href)
        items = markup.join(
            markup.join([markup.tag("dt", k), markup.tag("dd", v)]) for k, v in facts
        )
        detail = record.detail if record else None
        body = markup.join([head, markup.tag("dl", items, class_="facts"), _tool_calls(detail)])
        sections.append(markup.tag("section", body, class_="node", data_node=node))
    return markup.join(sections)


def _record_facts(
    node: str, record: flowrun_api.NodeStatus | None, output_href: Any
) -> list[tuple[str, Any]]:
    """What a node's record tells: its error, earlier attempts' errors, output and usage."""
    if record is None:
        return [("Output", _output(None, None, None))]
    facts: list[tuple[str, Any]] = []
    if record.error:
        facts.append(("Error", markup.tag("pre", record.error, class_="error")))
    for failed in record.attempt_errors:
        facts.append(("Earlier attempt", markup.tag("pre", failed)))
    href = output_href(node) if record.output_ref else None
    facts.append(("Output", _output(record.output, record.output_ref, href)))
    if record.usage:
        facts.append(("Usage", markup.text(_usage(record.usage))))
    return facts


def events(items: list[dict[str, Any]]) -> markup.Html:
    """The run's Kubernetes Events, oldest first."""
    ordered = sorted(items, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    rows = [
        (
            e.get("lastTimestamp") or e.get("eventTime") or "",
            e.get("type", ""),
            e.get("reason", ""),
            e.get("message", ""),
        )
        for e in ordered
    ]
    return markup.table(("Time", "Type", "Reason", "Message"), rows, class_="events")

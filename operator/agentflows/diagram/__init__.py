"""Pictures of a Flow, or of a run of one: Mermaid, Graphviz DOT and SVG.

The public surface is three functions, called by ``agentflows graph``
(:mod:`agentflows.cli.commands_graph`) and by the web console::

    from agentflows import diagram
    diagram.mermaid(flow_spec)                       # Markdown-ready text
    diagram.dot(flow_spec, run_status.nodes)         # a run: nodes coloured by phase
    diagram.svg(flow_spec, nodes_status, flows=snapshot_flows)

``flow_spec`` is a :class:`~agentflows.api.flow.FlowSpec`. ``nodes_status``, for a run, is its
``status.nodes`` (typed records or their wire JSON); with it every node shows its phase and
duration, and nodes without a record show Pending. ``flows`` maps Flow names to specs (a run's
snapshot) so ``flow`` nodes and ``map`` nodes over a flow are drawn with the sub-flow inside.

The layers: this package imports ``api`` and ``engine`` only; reading a FlowRun or its
snapshot from a cluster is the caller's business. :mod:`~agentflows.diagram.shape` decides what
is drawn; the writers only escape and print it; Graphviz lays out the SVG
(:mod:`~agentflows.diagram.svg_render`), which raises :class:`GraphvizMissing` without ``dot``.
"""

from __future__ import annotations

from collections.abc import Mapping

from agentflows.api import flow as flow_api
from agentflows.diagram import dot_text, mermaid_text, shape, svg_render

GraphvizMissing = svg_render.GraphvizMissing
NodesStatus = shape.NodesStatus


def mermaid(
    flow_spec: flow_api.FlowSpec,
    nodes_status: NodesStatus | None = None,
    *,
    flows: Mapping[str, flow_api.FlowSpec] | None = None,
) -> str:
    """The flow (or run) as a Mermaid flowchart."""
    return mermaid_text.render(shape.build(flow_spec, nodes_status, flows))


def dot(
    flow_spec: flow_api.FlowSpec,
    nodes_status: NodesStatus | None = None,
    *,
    flows: Mapping[str, flow_api.FlowSpec] | None = None,
) -> str:
    """The flow (or run) as Graphviz DOT."""
    return dot_text.render(shape.build(flow_spec, nodes_status, flows))


def svg(
    flow_spec: flow_api.FlowSpec,
    nodes_status: NodesStatus | None = None,
    *,
    flows: Mapping[str, flow_api.FlowSpec] | None = None,
) -> str:
    """The flow (or run) as an SVG document laid out by Graphviz, without links or scripts.

    Raises :class:`GraphvizMissing` when Graphviz's ``dot`` is not installed.
    """
    return svg_render.layout(dot(flow_spec, nodes_status, flows=flows))

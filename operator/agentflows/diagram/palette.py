"""The colours of node phases in pictures of a run, shared by the Mermaid and DOT writers.

Light fills with a darker stroke of the same hue, so black text stays readable on each; a node
of a run that has no record yet is Pending: white with a grey stroke.
"""

from __future__ import annotations

import dataclasses

from agentflows.api import flowrun as flowrun_api


@dataclasses.dataclass(frozen=True)
class Colours:
    """Fill and stroke of one phase, as #rrggbb."""

    fill: str
    stroke: str


#: Phase -> colours: the NodePhase values and shape.PENDING.
PHASES: dict[str, Colours] = {
    flowrun_api.NodePhase.SUCCEEDED: Colours("#d4edda", "#2e7d32"),
    flowrun_api.NodePhase.FAILED: Colours("#f8d7da", "#c62828"),
    flowrun_api.NodePhase.RUNNING: Colours("#cce5ff", "#1565c0"),
    flowrun_api.NodePhase.WAITING: Colours("#fff3cd", "#b26a00"),
    flowrun_api.NodePhase.SKIPPED: Colours("#eeeeee", "#9e9e9e"),
    # shape.PENDING: a node with no record yet
    "Pending": Colours("#ffffff", "#bdbdbd"),
}
#: Text colour on every fill.
TEXT = "#1b1b1b"
#: Fill of a group when no phase is shown.
GROUP_FILL = "#f6f8fa"

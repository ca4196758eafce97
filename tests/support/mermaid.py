"""Mermaid flowcharts read back, for tests of ``agentflows graph`` and :mod:`agentflows.diagram`.

:class:`ParsedMermaid` understands exactly the lines the diagram writes (boxes, subgraphs,
links, classDef, class and style lines) and keeps any other line in ``other``, so a test can assert that
no text from a Flow turned into a line of its own.
"""

from __future__ import annotations

import re


class ParsedMermaid:
    """A Mermaid flowchart read back: labels by key, edges, subgraphs and their members."""

    BOX = re.compile(r'^\s*(n\d+)\["(.*)"\]$')
    SUBGRAPH = re.compile(r'^\s*subgraph (n\d+)\["(.*)"\]$')
    EDGE = re.compile(r'^\s*(n\d+) (-->|-\.->)(?:\|"(.*)"\|)? (n\d+)$')
    #: What a dotted link (a loop's back edge) says after its case values.
    LOOP = re.compile(r"^(?:(.*) · )?loop, max (\d+)$")
    CLASS_DEF = re.compile(r"^\s*classDef (\w+) (.+)$")
    CLASS = re.compile(r"^\s*class ([\w,]+) (\w+)$")
    STYLE = re.compile(r"^\s*style (n\d+) (.+)$")

    def __init__(self, text: str) -> None:
        lines = text.splitlines()
        assert lines[0] == "flowchart TD"
        self.labels: dict[str, list[str]] = {}
        self.groups: dict[str, list[str]] = {}
        self.edges: list[tuple[str, str, str | None]] = []
        #: Dotted links (back edges) by (from key, to key): the loop's bound they show.
        self.back_edges: dict[tuple[str, str], int] = {}
        self.class_defs: dict[str, str] = {}
        self.classes: dict[str, str] = {}
        self.styles: dict[str, str] = {}
        self.other: list[str] = []
        open_groups: list[str] = []
        for line in lines[1:]:
            if m := self.SUBGRAPH.match(line):
                self.labels[m[1]] = [decode(m[2])]
                self.groups[m[1]] = []
                open_groups.append(m[1])
            elif line.strip() == "end":
                open_groups.pop()
            elif m := self.BOX.match(line):
                self.labels[m[1]] = [decode(part) for part in m[2].split("<br>")]
                if open_groups:
                    self.groups[open_groups[-1]].append(m[1])
            elif m := self.EDGE.match(line):
                label = decode(m[3]) if m[3] else None
                if m[2] == "-.->":
                    loop = self.LOOP.match(label or "")
                    assert loop is not None, line
                    self.back_edges[(m[1], m[4])] = int(loop[2])
                    label = loop[1]
                self.edges.append((m[1], m[4], label))
            elif m := self.CLASS_DEF.match(line):
                self.class_defs[m[1]] = m[2]
            elif m := self.CLASS.match(line):
                self.classes.update(dict.fromkeys(m[1].split(","), m[2]))
            elif m := self.STYLE.match(line):
                self.styles[m[1]] = m[2]
            else:
                self.other.append(line.strip())
        assert not open_groups

    def key(self, first_line: str) -> str:
        """The key of the one element whose label starts with ``first_line`` (a node id)."""
        (found,) = [k for k, lines in self.labels.items() if lines[0].split(" · ")[0] == first_line]
        return found

    def edge_pairs(self) -> set[tuple[str, str, str | None]]:
        """Edges as (from id, to id, label)."""
        return {
            (self.labels[a][0].split(" · ")[0], self.labels[b][0].split(" · ")[0], label)
            for a, b, label in self.edges
        }


def decode(text: str) -> str:
    """Mermaid entity codes (#60;) back to characters; anything else must be a safe character."""
    plain = re.sub(r"#(\d+);", "", text)
    assert all(c.isalnum() or c in " -_.,:/()" for c in plain), text
    return re.sub(r"#(\d+);", lambda m: chr(int(m[1])), text)

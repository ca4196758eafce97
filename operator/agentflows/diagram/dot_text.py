"""A picture of a flow as Graphviz DOT, which ``dot`` lays out (:mod:`.svg_render`).

Boxes are nodes ``n0``, groups are clusters ``cluster_n1``; a link to or from a group points
at its first or last box with ``lhead``/``ltail`` (``compound=true``) so the arrow ends at the
frame. Labels are double-quoted strings in which backslashes and quotes are escaped and
control characters dropped, so no text from a Flow can end a label, add an attribute (such as
``URL`` or ``href``) or use Graphviz's escapes (a backslash then N, G or L). Nothing written
here is a link.
"""

from __future__ import annotations

from agentflows.diagram import palette, shape

_FONT = "Helvetica,Arial,sans-serif"
_HEADER = [
    "digraph flow {",
    f'  graph [rankdir=TB, compound=true, fontname="{_FONT}", fontsize=11];',
    f'  node [shape=box, style="rounded,filled", fillcolor="#ffffff", color="#57606a", '
    f'fontname="{_FONT}", fontsize=11, fontcolor="{palette.TEXT}"];',
    f'  edge [color="#57606a", fontname="{_FONT}", fontsize=10];',
]


def text(value: str) -> str:
    """``value`` as the inside of a double-quoted DOT string, on one line."""
    cleaned = "".join(c if c.isprintable() else " " for c in value)
    return cleaned.replace("\\", "\\\\").replace('"', '\\"')


def _label(lines: list[str]) -> str:
    return '"' + "\\n".join(text(line) for line in lines) + '"'


def _colours(phase: str | None) -> str:
    if phase is None:
        return ""
    colours = palette.PHASES[phase]
    return f', fillcolor="{colours.fill}", color="{colours.stroke}"'


def _elements(
    elements: list[shape.Box | shape.Group], links: list[shape.Link], indent: str
) -> list[str]:
    out: list[str] = []
    for element in elements:
        if isinstance(element, shape.Box):
            out.append(
                f"{indent}{element.key} [label={_label(element.lines)}{_colours(element.phase)}];"
            )
            continue
        fill = palette.PHASES[element.phase].fill if element.phase else palette.GROUP_FILL
        stroke = palette.PHASES[element.phase].stroke if element.phase else "#8c959f"
        out += [
            f"{indent}subgraph cluster_{element.key} {{",
            f'{indent}  label={_label([element.title])}; style="rounded,filled"; '
            f'fillcolor="{fill}"; color="{stroke}";',
            *_elements(element.children, element.links, indent + "  "),
            f"{indent}}}",
        ]
    out += [f"{indent}{_link(link)}" for link in links]
    return out


def _link(link: shape.Link) -> str:
    attributes = []
    tail, head = link.source, link.target
    if isinstance(tail, shape.Group):
        attributes.append(f"ltail=cluster_{tail.key}")
        tail = tail.exit()
    if isinstance(head, shape.Group):
        attributes.append(f"lhead=cluster_{head.key}")
        head = head.entry()
    label = shape.loop_label(link)
    if label:
        attributes.append(f'label="{text(label)}"')
    if link.loop_bound is not None:
        attributes.append("style=dashed")
    shown = f" [{', '.join(attributes)}]" if attributes else ""
    return f"{tail.key} -> {head.key}{shown};"


def render(picture: shape.Picture) -> str:
    """The DOT text of a picture, ending with a newline."""
    return "\n".join([*_HEADER, *_elements(picture.children, picture.links, "  "), "}"]) + "\n"

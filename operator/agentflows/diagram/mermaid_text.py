"""A picture of a flow as a Mermaid flowchart (pastes into GitHub and GitLab Markdown).

Boxes are ``n0["label"]``, groups ``subgraph n1["title"] ... end``, links ``a -->|"case"| b``,
a loop's back edge dotted: ``a -.->|"loop, max 5"| b``.
Every label is written in double quotes with each character outside a small safe set as a
Mermaid entity code (``#60;`` for ``<``), so no text from a Flow can close a label, start a
directive (``%%{init}``, ``click``), a Markdown string or HTML: it shows as the text it is.
Phases colour boxes with one ``classDef`` per phase and groups with ``style``.
"""

from __future__ import annotations

from agentflows.diagram import palette, shape

#: Characters written as they are; any other is an entity code.
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 -_.,:/()")


def text(value: str) -> str:
    """``value`` as the inside of a double-quoted Mermaid label."""
    return "".join(c if c in _SAFE else f"#{ord(c)};" for c in value)


def _label(lines: list[str]) -> str:
    return '"' + "<br>".join(text(line) for line in lines) + '"'


def _elements(
    elements: list[shape.Box | shape.Group], links: list[shape.Link], indent: str
) -> list[str]:
    out: list[str] = []
    for element in elements:
        if isinstance(element, shape.Box):
            out.append(f"{indent}{element.key}[{_label(element.lines)}]")
            continue
        out.append(f"{indent}subgraph {element.key}[{_label([element.title])}]")
        out += _elements(element.children, element.links, indent + "  ")
        out.append(f"{indent}end")
    for link in links:
        line = "-.->" if link.loop_bound is not None else "-->"
        label = shape.loop_label(link)
        arrow = f'{line}|"{text(label)}"|' if label else line
        out.append(f"{indent}{link.source.key} {arrow} {link.target.key}")
    return out


def _styles(picture: shape.Picture) -> list[str]:
    """Styles: a classDef per phase shown, class lines for boxes, style lines for groups."""
    boxes: dict[str, list[str]] = {}
    groups: list[str] = []
    stack: list[shape.Box | shape.Group] = list(picture.children)
    while stack:
        element = stack.pop(0)
        if isinstance(element, shape.Group):
            stack += element.children
        if element.phase is None:
            continue
        if isinstance(element, shape.Box):
            boxes.setdefault(element.phase, []).append(element.key)
            continue
        colours = palette.PHASES[element.phase]
        groups.append(f"  style {element.key} fill:{colours.fill},stroke:{colours.stroke}")
    out = []
    for phase, keys in boxes.items():
        colours = palette.PHASES[phase]
        name = phase.lower()
        out.append(
            f"  classDef {name} fill:{colours.fill},stroke:{colours.stroke},color:{palette.TEXT}"
        )
        out.append(f"  class {','.join(keys)} {name}")
    return out + groups


def render(picture: shape.Picture) -> str:
    """The Mermaid text of a picture (top to bottom), ending with a newline."""
    lines = ["flowchart TD", *_elements(picture.children, picture.links, "  ")]
    return "\n".join([*lines, *_styles(picture)]) + "\n"

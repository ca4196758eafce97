"""SVG of a flow: the DOT text laid out by Graphviz's ``dot -Tsvg``, then made inert.

Graphviz is a program, not a Python dependency: ``dot`` is looked up on ``PATH`` and run as a
subprocess with the DOT text on stdin. When it is missing, :class:`GraphvizMissing` says how to
install it. The SVG is shown in browsers (the console), so after layout it is parsed and
stripped of everything that could act rather than show: ``<a>`` elements (their content kept),
``<script>`` and ``<foreignObject>``, and any ``href`` or ``on*`` attribute. Text in it was
escaped by Graphviz as XML, and the DOT writer never emits ``URL``, ``href`` or ``tooltip``.
"""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET

from agentflows.api import errors

_SVG = "http://www.w3.org/2000/svg"
_XLINK = "http://www.w3.org/1999/xlink"
#: Elements removed with their content.
_DROPPED = frozenset({"script", "foreignObject", "iframe", "object", "embed"})
#: Seconds ``dot`` may take: a flow has at most a few thousand boxes.
DOT_TIMEOUT = 60

ET.register_namespace("", _SVG)
ET.register_namespace("xlink", _XLINK)


class GraphvizMissing(errors.AgentflowsError):
    """``dot`` is not installed, so no SVG can be made (install Graphviz and try again)."""


class LayoutFailed(errors.AgentflowsError):
    """``dot`` refused the DOT text or did not finish (a bug here, not a user's mistake)."""


def layout(dot_text: str) -> str:
    """Run ``dot -Tsvg`` on ``dot_text`` and return the inert SVG."""
    program = shutil.which("dot")
    if program is None:
        raise GraphvizMissing(
            "-o svg needs Graphviz's dot program, which is not on PATH "
            "(install Graphviz: apt-get install graphviz, dnf install graphviz, "
            "brew install graphviz)"
        )
    try:
        done = subprocess.run(
            [program, "-Tsvg"],
            input=dot_text.encode(),
            capture_output=True,
            timeout=DOT_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise LayoutFailed(f"dot took longer than {DOT_TIMEOUT}s") from exc
    if done.returncode != 0:
        raise LayoutFailed(f"dot failed: {done.stderr.decode(errors='replace').strip()}")
    return inert(done.stdout)


def _local(name: str) -> str:
    return name.rsplit("}", 1)[-1]


def _clean(parent: ET.Element) -> None:
    index = 0
    while index < len(parent):
        child = parent[index]
        tag = _local(child.tag)
        if tag in _DROPPED:
            del parent[index]
            continue
        if tag == "a":
            del parent[index]
            for offset, grandchild in enumerate(list(child)):
                parent.insert(index + offset, grandchild)
            continue
        for attribute in list(child.attrib):
            local = _local(attribute).lower()
            if local == "href" or local.startswith("on"):
                del child.attrib[attribute]
        _clean(child)
        index += 1


def inert(svg: bytes) -> str:
    """An SVG document without links, scripts or event handlers (see the module docstring)."""
    root = ET.fromstring(svg)
    for attribute in list(root.attrib):
        if _local(attribute).lower().startswith("on"):
            del root.attrib[attribute]
    _clean(root)
    body = ET.tostring(root, encoding="unicode")
    return '<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n' + body + "\n"

"""Expressions: ``=jq`` programs and ``{{ jq }}`` interpolation, compiled once, evaluated often.

A string that starts with ``=`` is a jq program over the scope ``{run, nodes, item, items}``;
its value is the program's single output (no output is null; several outputs become a list).
Any other string may hold ``{{ jq }}`` parts, replaced by their value as text (null becomes
the empty string, strings are inserted as they are, other values as JSON). Objects and lists
are templates whose leaves are evaluated the same way. Missing paths yield null, as in jq.

Every expression is compiled when a Flow is validated, so a bad one is a Flow error with a
path, never a surprise at run time.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

import jq

_INTERPOLATION = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)


class ExpressionError(Exception):
    """An expression failed to compile or to evaluate."""


_NODE_REF = re.compile(r'\.nodes(?:\.([A-Za-z_][A-Za-z0-9_]*)|\[\s*"([^"\\]+)"\s*\])')
_NODES_WORD = re.compile(r"\bnodes\b")
#: A "." that reads the scope root itself (". as $x", ".[]", ".."), not a field of it.
_ROOT_ACCESS = re.compile(r'(?<![\w\])}"?])\.(?![A-Za-z_])')


def referenced_nodes(source: str) -> frozenset[str] | None:
    """The node ids a jq program reads, or None when it may read any (the whole scope).

    jq parses its input on every evaluation, so handing it only ``.run``, ``.item(s)`` and the
    nodes a program names keeps a long flow's per-node cost flat. Anything this simple check
    cannot prove (the root itself, ``.nodes`` as a whole) gets the whole scope.
    """
    if _ROOT_ACCESS.search(source):
        return None
    refs = _NODE_REF.findall(source)
    if len(refs) != len(_NODES_WORD.findall(source)):
        return None
    return frozenset(a or b for a, b in refs)


@dataclasses.dataclass(frozen=True)
class _Program:
    source: str
    program: Any
    #: Node ids the program reads (None: all of them).
    needs: frozenset[str] | None = None

    def run(self, scope: Scope) -> Any:
        try:
            values = self.program.input_text(scope.json_for(self.needs)).all()
        except ValueError as exc:
            raise ExpressionError(f"jq {self.source!r}: {_clean(str(exc))}") from exc
        if not values:
            return None
        if len(values) == 1:
            return values[0]
        return values


@dataclasses.dataclass(frozen=True)
class Template:
    """A compiled value: evaluate it with :func:`evaluate`."""

    #: One of "literal", "program", "interpolation", "object", "array".
    shape: str
    value: Any = None
    program: _Program | None = None
    parts: tuple[str | _Program, ...] = ()
    children: tuple[tuple[str, Template], ...] = ()
    items: tuple[Template, ...] = ()

    @property
    def is_literal(self) -> bool:
        """True when evaluation needs no scope."""
        return self.shape == "literal"


def _clean(message: str) -> str:
    text = " ".join(message.split())
    text = text.replace("jq: error: ", "").replace(" jq: 1 compile error", "")
    return text.split(" at <top-level>")[0] if "syntax error" in text else text


def compile_program(source: str) -> _Program:
    """Compile one jq program; raise ExpressionError with jq's message."""
    try:
        return _Program(source, jq.compile(source), referenced_nodes(source))
    except ValueError as exc:
        raise ExpressionError(f"jq syntax error in {source!r}: {_clean(str(exc))}") from exc


def compile_template(value: Any) -> Template:
    """Compile a value that may contain expressions; raise ExpressionError on a bad one."""
    if isinstance(value, str):
        if value.startswith("="):
            return Template("program", program=compile_program(value[1:]))
        pieces = _INTERPOLATION.split(value)
        if len(pieces) == 1:
            return Template("literal", value=value)
        parts: list[str | _Program] = []
        for index, piece in enumerate(pieces):
            if index % 2:
                parts.append(compile_program(piece.strip()))
            elif piece:
                parts.append(piece)
        return Template("interpolation", parts=tuple(parts))
    if isinstance(value, Mapping):
        children = tuple((str(k), compile_template(v)) for k, v in value.items())
        if all(child.is_literal for _, child in children):
            return Template("literal", value=value)
        return Template("object", children=children)
    if isinstance(value, list):
        items = tuple(compile_template(v) for v in value)
        if all(item.is_literal for item in items):
            return Template("literal", value=value)
        return Template("array", items=items)
    return Template("literal", value=value)


def compile_expression(source: str) -> Template:
    """Compile a field that is always an expression (``on``, ``items``, ``transform``, ``output``).

    The leading ``=`` is optional there: the field is jq whether or not it starts with one.
    """
    return Template(
        "program", program=compile_program(source[1:] if source.startswith("=") else source)
    )


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


Render = Callable[[frozenset[str] | None], str]


class Scope:
    """The expression scope; jq reads it as JSON text, rendered per set of nodes a program needs."""

    def __init__(self, values: Mapping[str, Any], render: Render | None = None) -> None:
        self.values = values
        self._render = render
        self._texts: dict[frozenset[str] | None, str] = {}

    def json_for(self, needs: frozenset[str] | None) -> str:
        """The scope as JSON text, with only the nodes in ``needs`` (None: all)."""
        text = self._texts.get(needs)
        if text is None:
            if self._render is not None:
                text = self._render(needs)
            else:
                text = json.dumps(self.values, ensure_ascii=False, default=str)
            self._texts[needs] = text
        return text


def evaluate(template: Template, scope: Scope) -> Any:
    """Evaluate a compiled template against a scope."""
    if template.shape == "literal":
        return template.value
    if template.shape == "program":
        assert template.program is not None
        return template.program.run(scope)
    if template.shape == "interpolation":
        return "".join(
            part if isinstance(part, str) else _as_text(part.run(scope)) for part in template.parts
        )
    if template.shape == "object":
        return {key: evaluate(child, scope) for key, child in template.children}
    return [evaluate(item, scope) for item in template.items]


def truthy(value: Any) -> bool:
    """Jq truthiness: everything but null and false."""
    return value is not None and value is not False


def case_key(value: Any) -> str:
    """The string a branch value is matched against ``cases`` keys with."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return _as_text(value)

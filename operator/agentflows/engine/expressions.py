"""Expressions: ``=jq`` programs and ``{{ jq }}`` interpolation, compiled once, evaluated often.

A string that starts with ``=`` is a jq program over the scope ``{run, nodes, item, items}``;
its value is the program's single output (no output is null; several outputs become a list).
Any other string may hold ``{{ jq }}`` parts, replaced by their value as text (null becomes
the empty string, strings are inserted as they are, other values as JSON). Objects and lists
are templates whose leaves are evaluated the same way. Missing paths yield null, as in jq.

Every expression is compiled when a Flow is validated, so a bad one is a Flow error with a
path, never a surprise at run time. Compiling also refuses what would reach outside the scope
(``$ENV``, ``env``, ``input``, modules: :mod:`agentflows.engine.jqcheck`), so no expression
can read the process environment, where the runner keeps the Secrets its Agents reference.

**Bounds.** jq runs in C and cannot be interrupted, so where a program runs depends on what it
can cost. A program :func:`jqcheck.is_cheap` proves bounded by a small multiple of its input
runs in this process when its input is at most :data:`CHEAP_INPUT_BYTES` (a path, a template
interpolation, a comparison: the engine's common case, and its per-node cost). Every other
program runs in the worker pool of :mod:`agentflows.engine.jqsandbox`: empty environment, a
memory limit, killed at its deadline. The deadline is the scope's ``deadline`` (the run's
remaining ``limits.timeoutSeconds``, when the host passes it) capped by
:data:`DEFAULT_TIMEOUT_SECONDS` per expression; a bound that is hit is an
:class:`ExpressionError` ("expression exceeded 2 s", "... memory limit"), so the node fails
like any other bad expression. :func:`evaluate` blocks its thread (the engine's run loop calls
it between awaits, and the pool keeps that wait bounded); code on a shared event loop (the
operator's trigger filters, the webhook receiver) uses :func:`evaluate_async`.

**Validation work** is linear in the document's distinct content: programs are compiled once
per source (a cache shared by every Flow), the distinct programs of one field are checked by
one jq compile, and a value reached twice through YAML aliases is compiled once. A template
that would expand to more than :data:`MAX_TEMPLATE_VALUES` evaluations (an alias bomb with an
expression inside) is refused with its size.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import re
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import jq

from agentflows.api import errors
from agentflows.engine import jqcheck, jqsandbox

#: Longest an expression may run when the scope carries no earlier deadline.
DEFAULT_TIMEOUT_SECONDS = 5.0
#: Largest input (JSON text) a cheap program is evaluated over in this process.
CHEAP_INPUT_BYTES = 64 * 1024
#: Most evaluations one compiled template may expand to (YAML aliases repeat their target).
MAX_TEMPLATE_VALUES = 100_000
#: Longest compiling a program (or a batch of them) in the worker pool may take.
CHECK_SECONDS = 60.0

_INTERPOLATION = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)

#: The scope's JSON text of a value: ``json.dumps(value, ensure_ascii=False, default=str)``
#: without building an encoder per call (json.dumps makes one for any non-default argument,
#: and the engine encodes each node output into the scope).
scope_json: Callable[[Any], str] = json.JSONEncoder(ensure_ascii=False, default=str).encode


class ExpressionError(errors.AgentflowsError):
    """An expression failed to compile or to evaluate."""


class ExpressionLimit(ExpressionError):
    """An expression's evaluation hit its time, memory or result-size bound.

    Its own fault: the same program over the same input would hit it again.
    """


class ExpressionBusy(ExpressionError):
    """Every evaluator stayed busy with other expressions until this one's deadline.

    Not this expression's fault: evaluating it again later may well succeed.
    """

    retryable = True


_NODE_REF = re.compile(r'\.nodes(?:\.([A-Za-z_][A-Za-z0-9_]*)|\[\s*"([^"\\]+)"\s*\])')
_NODES_WORD = re.compile(r"\bnodes\b")
_ITERATIONS_WORD = re.compile(r"\biterations\b")
#: In a program's needs: it reads ``.iterations`` (a loop's earlier outputs); no node id is this.
ITERATIONS = "#iterations"
#: A "." that reads the scope root itself (". as $x", ".[]", ".."), not a field of it.
_ROOT_ACCESS = re.compile(r'(?<![\w\])}"?])\.(?![A-Za-z_])')


def referenced_nodes(source: str) -> frozenset[str] | None:
    """The node ids a jq program reads, or None when it may read any (the whole scope).

    jq parses its input on every evaluation, so handing it only ``.run``, ``.item(s)`` and the
    nodes a program names keeps a long flow's per-node cost flat. Anything this simple check
    cannot prove (the root itself, ``.nodes`` as a whole) gets the whole scope. A program that
    says ``iterations`` anywhere also gets the loops' earlier outputs (:data:`ITERATIONS`).
    """
    if _ROOT_ACCESS.search(source):
        return None
    refs = _NODE_REF.findall(source)
    if len(refs) != len(_NODES_WORD.findall(source)):
        return None
    iterations = {ITERATIONS} if _ITERATIONS_WORD.search(source) else set()
    return frozenset({a or b for a, b in refs} | iterations)


@dataclasses.dataclass(frozen=True)
class _Program:
    source: str
    #: Node ids the program reads (None: all of them).
    needs: frozenset[str] | None = None
    #: Bounded by its input's size (:func:`jqcheck.is_cheap`): may run in this process.
    cheap: bool = False

    def in_process(self, scope: Scope) -> bool:
        """Whether this evaluation runs here rather than in the worker pool."""
        return self._runs_here(scope.json_for(self.needs))

    def _runs_here(self, text: str) -> bool:
        """Whether this program over the input ``text`` runs in this process."""
        return self.cheap and len(text) <= CHEAP_INPUT_BYTES

    def run(self, scope: Scope) -> Any:
        text = scope.json_for(self.needs)
        try:
            if self._runs_here(text):
                values = _jq_program(self.source).input_text(text).all()
            else:
                values = jqsandbox.evaluate(self.source, text, scope.seconds_left())
        except (ValueError, jqsandbox.EvaluationError) as exc:
            raise ExpressionError(f"jq {self.source!r}: {_clean(str(exc))}") from exc
        except jqsandbox.Busy as exc:
            raise ExpressionBusy(f"jq {self.source!r}: {exc}") from exc
        except jqsandbox.Exceeded as exc:
            raise ExpressionLimit(f"jq {self.source!r}: {exc}") from exc
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
    #: How many values evaluating it computes, counting repeats (a YAML alias repeats).
    weight: int = 1

    @property
    def is_literal(self) -> bool:
        """True when evaluation needs no scope."""
        return self.shape == "literal"

    def programs(self) -> tuple[_Program, ...]:
        """Its distinct programs."""
        return self._programs

    @functools.cached_property
    def _programs(self) -> tuple[_Program, ...]:
        # Found once per template: evaluate_async asks for them at every evaluation (a
        # frozen dataclass keeps a cached_property, which writes the instance's __dict__).
        found: list[_Program] = []
        seen: set[int] = set()
        pending: list[Template] = [self]
        while pending:
            template = pending.pop()
            if id(template) in seen:
                continue
            seen.add(id(template))
            if template.program is not None:
                found.append(template.program)
            found.extend(p for p in template.parts if isinstance(p, _Program))
            pending.extend(child for _, child in template.children)
            pending.extend(template.items)
        return tuple(found)


def _clean(message: str) -> str:
    text = " ".join(message.split())
    text = text.replace("jq: error: ", "").replace(" jq: 1 compile error", "")
    return text.split(" at <top-level>")[0] if "syntax error" in text else text


def compile_program(source: str) -> _Program:
    """Compile one jq program; raise ExpressionError with jq's message or what it may not use.

    Cached by source: a program is compiled once however many fields and Flows hold it.
    """
    return _compile_program(source)


#: Sources jq accepted as part of a batch (:func:`_check_together`), compiled on first use.
_CHECKED: set[str] = set()
_MAX_CHECKED = 100_000


@functools.lru_cache(maxsize=4096)
def _jq_program(source: str) -> Any:
    return jq.compile(source)


def _compiles(source: str, cheap: bool) -> None:
    """Compile ``source`` (ValueError with jq's message when jq refuses it).

    jq folds constant expressions as it compiles (``"x" * 2e9`` allocates 2 GB before
    anything runs), so only a cheap program, which has no operator that multiplies a size, is
    compiled in this process; every other one in the worker pool, under its memory limit.
    """
    if cheap:
        _jq_program(source)
        return
    try:
        jqsandbox.check(source, CHECK_SECONDS)
    except jqsandbox.EvaluationError as exc:
        raise ValueError(str(exc)) from exc


@functools.lru_cache(maxsize=8192)
def _compile_program(source: str) -> _Program:
    tokens = jqcheck.tokenize(source)
    cheap = jqcheck.is_cheap(tokens)
    if source not in _CHECKED:
        try:
            _compiles(source, cheap)
        except ValueError as exc:
            raise ExpressionError(f"jq syntax error in {source!r}: {_clean(str(exc))}") from exc
        except jqsandbox.Exceeded as exc:
            raise ExpressionLimit(f"jq {source!r}: compiling it: {exc}") from exc
    refused = jqcheck.refusal(tokens)
    if refused is not None:
        raise ExpressionError(f"jq {source!r}: {refused}")
    return _Program(source, referenced_nodes(source), cheap)


def _check_together(sources: Iterable[str]) -> None:
    """Check many programs with one jq compile (jq spends about a millisecond on each).

    jq loads its builtins on every compile, so a field with thousands of distinct programs
    pays that once this way.
    Each program becomes the body of a uniquely named function, in parentheses, so it parses
    there exactly when it parses alone; programs that could reach past the parentheses (an
    unclosed string or bracket, a comment) are left to be compiled alone. When the batch fails,
    nothing is marked: each program is then compiled alone, with its own message.
    """
    pending = [
        source
        for source in dict.fromkeys(sources)
        if source not in _CHECKED and jqcheck.self_contained(source, jqcheck.tokenize(source))
    ]
    if len(pending) < 2:
        return
    tag = secrets.token_hex(8)
    body = "".join(f"def _af{tag}_{i}: (\n{source}\n);\n" for i, source in enumerate(pending))
    try:
        _compiles(body + ".", all(jqcheck.is_cheap(jqcheck.tokenize(s)) for s in pending))
    except (ValueError, jqsandbox.Exceeded):
        return
    if len(_CHECKED) + len(pending) > _MAX_CHECKED:
        _CHECKED.clear()
    _CHECKED.update(pending)


def _program_sources(value: Any, seen: set[int]) -> Iterator[str]:
    """Every program source in a value (each list or mapping walked once)."""
    if isinstance(value, str):
        if value.startswith("="):
            yield value[1:]
        elif "{{" in value:
            yield from (m.strip() for m in _INTERPOLATION.findall(value))
    elif isinstance(value, (Mapping, list)) and id(value) not in seen:
        seen.add(id(value))
        yield from (
            source
            for item in (value.values() if isinstance(value, Mapping) else value)
            for source in _program_sources(item, seen)
        )


def compile_template(value: Any) -> Template:
    """Compile a value that may contain expressions; raise ExpressionError on a bad one."""
    if isinstance(value, (Mapping, list)):
        _check_together(_program_sources(value, set()))
    return _TemplateCompiler().compile(value)


class _TemplateCompiler:
    """One walk of a value; a list or mapping reached again (a YAML alias) is compiled once."""

    def __init__(self) -> None:
        self._seen: dict[int, Template] = {}

    def compile(self, value: Any) -> Template:
        if isinstance(value, str):
            return _compile_text(value)
        if not isinstance(value, (Mapping, list)):
            return Template("literal", value=value)
        known = self._seen.get(id(value))
        if known is not None:
            return known
        template = self._container(value)
        if template.weight > MAX_TEMPLATE_VALUES:
            raise ExpressionError(
                f"expands to {template.weight:,} or more values to evaluate (YAML aliases "
                f"repeat what they point to); at most {MAX_TEMPLATE_VALUES:,} are allowed"
            )
        self._seen[id(value)] = template
        return template

    def _container(self, value: Mapping[str, Any] | list[Any]) -> Template:
        if isinstance(value, Mapping):
            children = tuple((str(k), self.compile(v)) for k, v in value.items())
            if all(child.is_literal for _, child in children):
                return Template("literal", value=value)
            weight = 1 + sum(child.weight for _, child in children)
            return Template("object", children=children, weight=weight)
        items = tuple(self.compile(v) for v in value)
        if all(item.is_literal for item in items):
            return Template("literal", value=value)
        return Template("array", items=items, weight=1 + sum(item.weight for item in items))


@functools.lru_cache(maxsize=8192)
def _compile_text(value: str) -> Template:
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
    return Template("interpolation", parts=tuple(parts), weight=len(parts))


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
    """The expression scope; jq reads it as JSON text, rendered per set of nodes a program needs.

    ``values`` may be given as a function, called on the first read of :attr:`values`: a scope
    with a ``render`` is read as text, and a loop's earlier outputs are not made into lists for
    every node. ``deadline`` (a :func:`time.monotonic` instant, e.g. the end of the run's
    ``limits.timeoutSeconds``) bounds every evaluation over this scope, together with
    :data:`DEFAULT_TIMEOUT_SECONDS` per expression.
    """

    def __init__(
        self,
        values: Mapping[str, Any] | Callable[[], Mapping[str, Any]],
        render: Render | None = None,
        *,
        deadline: float | None = None,
    ) -> None:
        self._values = values
        self._render = render
        self._texts: dict[frozenset[str] | None, str] = {}
        self.deadline = deadline

    @property
    def values(self) -> Mapping[str, Any]:
        """The scope ``{run, nodes, ...}`` as values."""
        if callable(self._values):
            self._values = self._values()
        return self._values

    def json_for(self, needs: frozenset[str] | None) -> str:
        """The scope as JSON text, with only the nodes in ``needs`` (None: all)."""
        text = self._texts.get(needs)
        if text is None:
            text = self._render(needs) if self._render is not None else scope_json(self.values)
            self._texts[needs] = text
        return text

    def seconds_left(self) -> float:
        """How long the next evaluation may take; ExpressionError once the deadline passed."""
        if self.deadline is None:
            return DEFAULT_TIMEOUT_SECONDS
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise ExpressionError("expression not evaluated: the run's time limit has passed")
        return min(left, DEFAULT_TIMEOUT_SECONDS)


def evaluate(template: Template, scope: Scope) -> Any:
    """Evaluate a compiled template against a scope (blocking at most the scope's bound)."""
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


async def evaluate_async(template: Template, scope: Scope) -> Any:
    """:func:`evaluate` for event-loop code: the loop never waits on a worker.

    Inline when every program runs in-process (cheap, over a small input), else in a thread.
    """
    if all(program.in_process(scope) for program in template.programs()):
        return evaluate(template, scope)
    return await asyncio.to_thread(evaluate, template, scope)


def truthy(value: Any) -> bool:
    """Jq truthiness: everything but null and false."""
    return value is not None and value is not False


def type_name(value: Any) -> str:
    """The JSON type of a value as jq's ``type`` names it (null, boolean, number, ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__


def case_key(value: Any) -> str:
    """The string a branch value is matched against ``cases`` keys with."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return _as_text(value)

r"""Regular expressions from users' JSON Schemas, matched in linear time (RE2).

Called by :mod:`agentflows.api.schemas`, the one owner of schema checks: :func:`problem` when a
schema is validated, and :func:`keywords` for the validator every check uses.

Why RE2 and not Python's ``re``: a Flow author's ``pattern`` is matched against data someone
else sends (``run --input``, ``resume --data``, webhook payloads, tool results, decisions), and
``re`` backtracks: ``^(a+)+$`` over 29 characters took 9 s and tripled every 2 characters. RE2
matches in time linear in the input whatever the pattern, so no pattern can stall a CLI, a
runner or the operator. The price is what RE2 cannot express — backreferences (``\1``) and
lookaround (``(?=...)``, ``(?<!...)``) — which a schema then names as an error with its path at
validation, and which a schema that skipped validation (an MCP server's tool parameters) gets
as a schema problem when data meets it, never as a fallback to ``re``.

jsonschema calls ``re.search`` in four keywords (``pattern``, ``patternProperties``, and the
``additionalProperties`` and ``unevaluatedProperties`` that look at patternProperties); each is
replaced here by the same keyword on RE2. ``format`` is not asserted by our validator, so a
``format: regex`` compiles nothing.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from agentflows.api import errors

if TYPE_CHECKING:
    import jsonschema

_BACKTRACKING_ONLY = (
    "patterns are matched in linear time (RE2): backreferences and lookaround are not supported"
)


class PatternError(errors.AgentflowsError, ValueError):
    """A pattern RE2 cannot compile; the message says why, with the pattern."""


@functools.cache
def _options() -> Any:
    import re2

    options = re2.Options()
    options.log_errors = False  # the error is ours to report, not RE2's to print on stderr
    return options


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> Any:
    import re2

    try:
        return re2.compile(_text(pattern), _options())
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args else str(exc)
        if isinstance(reason, bytes):
            reason = reason.decode(errors="replace")
        raise PatternError(
            f"not a valid regular expression {pattern[:80]!r}: {reason} ({_BACKTRACKING_ONLY})"
        ) from None


def _text(value: str) -> str:
    """``value`` with lone surrogates (valid in JSON, not in UTF-8) as U+FFFD, for RE2."""
    try:
        value.encode()
    except UnicodeEncodeError:
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return value


def problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot be matched, or None.

    It must also be a regular expression Python reads the same way: RE2 takes a repetition it
    cannot count (``a{99999999999}``) as literal text, which is not what its author meant.
    """
    try:
        re.compile(pattern)
    except (re.error, OverflowError, RecursionError, ValueError) as exc:
        return f"not a valid regular expression {pattern[:80]!r}: {exc}"
    try:
        _compiled(pattern)
    except PatternError as exc:
        return str(exc)
    return None


def search(pattern: str, text: str) -> bool:
    """Whether ``pattern`` matches somewhere in ``text``; PatternError if it cannot compile."""
    return _compiled(pattern).search(_text(text)) is not None


def _pattern(
    validator: Any, pattern: str, instance: Any, schema: Any
) -> Iterator[jsonschema.ValidationError]:
    import jsonschema

    if validator.is_type(instance, "string") and not search(pattern, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: Any, instance: Any, schema: Any
) -> Iterator[jsonschema.ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _matched_by_pattern(schema: Any, key: str) -> bool:
    return any(search(p, key) for p in schema.get("patternProperties", {}))


def _additional_properties(
    validator: Any, additional: Any, instance: Any, schema: Any
) -> Iterator[jsonschema.ValidationError]:
    import jsonschema

    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    extras = sorted(
        (k for k in instance if k not in properties and not _matched_by_pattern(schema, k)),
        key=str,
    )
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif additional is False and extras:
        joined = ", ".join(repr(each) for each in extras)
        if "patternProperties" in schema:
            patterns = ", ".join(repr(each) for each in sorted(schema["patternProperties"]))
            verb = "does" if len(extras) == 1 else "do"
            yield jsonschema.ValidationError(
                f"{joined} {verb} not match any of the regexes: {patterns}"
            )
        else:
            yield jsonschema.ValidationError(
                f"Additional properties are not allowed ({joined} unexpected)"
            )


def _valid(validator: Any, value: Any, schema: Any) -> bool:
    return next(validator.descend(value, schema), None) is None


def _evaluated_keys(validator: Any, instance: dict[str, Any], schema: Any) -> set[str]:
    """The keys ``schema`` evaluates (JSON Schema 2020-12, as jsonschema's own helper does)."""
    if not isinstance(schema, dict):
        return set()
    keys: set[str] = set()
    for word in ("$ref", "$dynamicRef"):
        if (ref := schema.get(word)) is not None:
            resolved = validator._resolver.lookup(ref)
            inner = validator.evolve(schema=resolved.contents, _resolver=resolved.resolver)
            keys |= _evaluated_keys(inner, instance, resolved.contents)
    if isinstance(properties := schema.get("properties"), dict):
        keys |= properties.keys() & instance.keys()
    for word in ("additionalProperties", "unevaluatedProperties"):
        if (subschema := schema.get(word)) is not None:
            keys |= {k for k, v in instance.items() if _valid(validator, v, subschema)}
    keys |= {k for k in instance if _matched_by_pattern(schema, k)}
    for name, subschema in schema.get("dependentSchemas", {}).items():
        if name in instance:
            keys |= _evaluated_keys(validator, instance, subschema)
    for word in ("allOf", "oneOf", "anyOf"):
        for subschema in schema.get(word, []):
            if _valid(validator, instance, subschema):
                keys |= _evaluated_keys(validator, instance, subschema)
    if "if" in schema:
        branch = "then" if _valid(validator, instance, schema["if"]) else "else"
        if branch == "then":
            keys |= _evaluated_keys(validator, instance, schema["if"])
        if branch in schema:
            keys |= _evaluated_keys(validator, instance, schema[branch])
    return keys


def _unevaluated_properties(
    validator: Any, unevaluated: Any, instance: Any, schema: Any
) -> Iterator[jsonschema.ValidationError]:
    import jsonschema

    if not validator.is_type(instance, "object"):
        return
    evaluated = _evaluated_keys(validator, instance, schema)
    failing = sorted(
        (
            k
            for k in instance
            if k not in evaluated and not _valid(validator, instance[k], unevaluated)
        ),
        key=str,
    )
    if failing:
        joined = ", ".join(repr(each) for each in failing)
        if unevaluated is False:
            message = f"Unevaluated properties are not allowed ({joined} unexpected)"
        else:
            message = f"Unevaluated properties are not valid under the given schema ({joined})"
        yield jsonschema.ValidationError(message)


def keywords() -> dict[str, Any]:
    """The keywords that match patterns, on RE2, for ``jsonschema.validators.extend``."""
    return {
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
        "unevaluatedProperties": _unevaluated_properties,
    }

"""Read a YAML stream as kubectl does, within bounds, with every failure located.

Called by :mod:`agentflows.api.documents` for every file the CLI reads. libyaml's C parser
(shipped inside PyYAML) turns the text into events, and one iterative pass folds the events
into plain JSON values. Doing the folding here rather than with PyYAML's composer and
constructor buys four things at once:

- **Bounded work.** An alias is never expanded: it refers to the value already built, and its
  size is counted. A stream whose values would expand beyond :data:`MAX_EXPANDED` (the same
  4 MiB a file may have) is refused, so a 423-byte "billion laughs" file costs microseconds.
  Nesting deeper than :data:`MAX_DEPTH` is refused before anything recurses over it.
- **kubectl's meaning.** Mapping keys become strings (``1`` -> ``"1"``, ``yes`` -> ``"true"``)
  while they are read, so ``{1: a, yes: b}`` keeps both keys; a duplicate key is an error as
  it is for kubectl; timestamps stay the strings they were written as; ``.inf`` and ``.nan``,
  which JSON cannot carry, are refused.
- **Located errors.** Every failure is a :class:`YamlError` naming the document, the path
  (``spec.nodes[0].transform``) and the line.
- **Speed.** Plain scalars are resolved once per distinct text; a 0.7 MB document reads in a
  fraction of a second.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import math
from typing import Any

import yaml

from agentflows.api import errors

#: Largest total size of a stream's values with every alias expanded (bytes of scalar text,
#: plus one per value); the same bound as a file's size.
MAX_EXPANDED = 4 * 1024 * 1024
#: Deepest nesting of mappings and lists accepted (Kubernetes objects are a few levels deep;
#: free-form inputs and schemas rarely need more than a dozen).
MAX_DEPTH = 100

_TAG = "tag:yaml.org,2002:"
_SCALAR_TAGS = {f"{_TAG}{name}" for name in ("null", "bool", "int", "float")}
_STR = f"{_TAG}str"
_TIMESTAMP = f"{_TAG}timestamp"
_BINARY = f"{_TAG}binary"
_MERGE = f"{_TAG}merge"
#: PyYAML resolves a plain ``=`` to this tag; kubectl reads it as the string "=".
_VALUE = f"{_TAG}value"
_MAP_TAGS = {None, "!", f"{_TAG}map"}
_SEQ_TAGS = {None, "!", f"{_TAG}seq"}


class YamlError(errors.AgentflowsError):
    """The stream cannot be read; ``document`` (1-based), ``path`` and ``line`` locate it."""

    def __init__(self, message: str, *, document: int = 0, path: str = "", line: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.document = document
        self.path = path
        self.line = line

    def __str__(self) -> str:
        where = f" (line {self.line})" if self.line else ""
        return f"{self.message}{where}"


@dataclasses.dataclass(frozen=True)
class Document:
    """One document of a stream: its 1-based position, its value, and numbers JSON cannot hold.

    ``.inf`` and ``.nan`` are kept in ``value`` (so the rest of the document is still checked)
    and listed in ``nonfinite`` with their paths: the document is not valid with them.
    """

    index: int
    value: Any
    nonfinite: list[YamlError]


@dataclasses.dataclass
class _Frame:
    """A mapping or list being read."""

    value: dict[str, Any] | list[Any]
    path: str
    anchor: str | None
    start: int
    key: str | None = None
    key_is_merge: bool = False
    key_lines: dict[str, int] = dataclasses.field(default_factory=dict)
    merges: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def child_path(self) -> str:
        if isinstance(self.value, list):
            return f"{self.path}[{len(self.value)}]"
        if self.key is None:
            return self.path
        return f"{self.path}.{self.key}" if self.path else str(self.key)


def key_text(key: Any) -> str:
    """A mapping key as kubectl's YAML reader turns it into a JSON object key."""
    if isinstance(key, bool):
        return "true" if key else "false"
    if key is None:
        return "null"
    return str(key)


class _Reader:
    """One pass over a stream's events; see the module docstring."""

    def __init__(self, text: str) -> None:
        self.parser = yaml.CSafeLoader(text)
        self.documents: list[Document] = []
        self.document = 0
        self.expanded = 0
        self.anchors: dict[str, tuple[Any, int]] = {}
        self.stack: list[_Frame] = []
        self.plain: dict[str, tuple[str, Any]] = {}
        self.nonfinite: list[YamlError] = []

    def error(self, message: str, event: Any, path: str | None = None) -> YamlError:
        where = path if path is not None else (self.stack[-1].child_path() if self.stack else "")
        return YamlError(
            message, document=self.document, path=where, line=event.start_mark.line + 1
        )

    def read(self) -> list[Document]:
        handlers = {
            yaml.ScalarEvent: self.on_scalar,
            yaml.AliasEvent: self.on_alias,
            yaml.MappingStartEvent: self.open,
            yaml.SequenceStartEvent: self.open,
            yaml.MappingEndEvent: self.close,
            yaml.SequenceEndEvent: self.close,
            yaml.DocumentStartEvent: self.on_document,
        }
        get_event = self.parser.get_event
        try:
            while True:
                event = get_event()
                if event is None or type(event) is yaml.StreamEndEvent:
                    return self.documents
                handler = handlers.get(type(event))
                if handler is not None:
                    handler(event)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark
            where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
            raise YamlError(
                f"malformed YAML: {where}{exc.problem or exc}", document=self.document
            ) from None
        except yaml.YAMLError as exc:
            raise YamlError(f"malformed YAML: {exc}", document=self.document) from None
        finally:
            self.parser.dispose()

    def on_scalar(self, event: Any) -> None:
        tag, value = self.scalar(event)
        if type(value) is float and not math.isfinite(value):
            # Reported, not raised: the rest of the document is still checked.
            message = f"{event.value} is not a finite number (JSON has no infinity or NaN)"
            self.nonfinite.append(self.error(message, event))
        self.add(event, value, len(event.value) + 1, tag)

    def on_alias(self, event: Any) -> None:
        if event.anchor not in self.anchors:
            raise self.error(f"unknown alias *{event.anchor}", event)
        value, size = self.anchors[event.anchor]
        self.add(event, value, size, None)

    def on_document(self, event: Any) -> None:
        self.document += 1
        self.anchors = {}

    def open(self, event: Any) -> None:
        is_map = isinstance(event, yaml.MappingStartEvent)
        if event.tag not in (_MAP_TAGS if is_map else _SEQ_TAGS):
            raise self.error(f"unsupported tag {event.tag}", event)
        if self.stack and self.stack[-1].key is None and isinstance(self.stack[-1].value, dict):
            raise self.error("a mapping key must be a string, number or boolean", event)
        path = self.stack[-1].child_path() if self.stack else ""
        if len(self.stack) >= MAX_DEPTH:
            shown = path if len(path) <= 60 else path[:60] + "..."
            raise self.error(f"nested deeper than {MAX_DEPTH} levels", event, shown)
        container: dict[str, Any] | list[Any] = {} if is_map else []
        self.stack.append(_Frame(container, path, event.anchor, self.expanded))
        self.expanded += 1

    def close(self, event: Any) -> None:
        frame = self.stack.pop()
        value: Any = frame.value
        if frame.merges:
            merged: dict[str, Any] = {}
            for source in reversed(frame.merges):
                merged.update(source)
            value = merged | value
        size = self.expanded - frame.start
        self.expanded = frame.start
        self.add(event, value, size, None, anchor=frame.anchor)

    def add(
        self, event: Any, value: Any, size: int, tag: str | None, anchor: str | None = None
    ) -> None:
        """Put a finished value into its mapping or list (or make it the document)."""
        self.expanded += size
        if self.expanded > MAX_EXPANDED:
            raise self.error(
                f"aliases expand the file beyond {MAX_EXPANDED} bytes, the limit for a file",
                event,
            )
        anchor = anchor if anchor is not None else getattr(event, "anchor", None)
        if anchor is not None and not isinstance(event, yaml.AliasEvent):
            self.anchors[anchor] = (value, size)
        if not self.stack:
            if value is not None:
                self.documents.append(Document(self.document, value, self.nonfinite))
            self.nonfinite = []
            return
        frame = self.stack[-1]
        if isinstance(frame.value, list):
            frame.value.append(value)
        elif frame.key is None:
            self.set_key(frame, event, value, tag)
        else:
            self.set_value(frame, event, value)

    def set_key(self, frame: _Frame, event: Any, value: Any, tag: str | None) -> None:
        if isinstance(value, (dict, list)):
            raise self.error("a mapping key must be a string, number or boolean", event)
        frame.key_is_merge = tag == _MERGE
        key = "<<" if frame.key_is_merge else key_text(value)
        line = event.start_mark.line + 1
        if not frame.key_is_merge and key in frame.key_lines:
            frame.key = key
            raise self.error(
                f'duplicate key "{key}" (first at line {frame.key_lines[key]}); '
                "kubectl refuses a mapping with a key twice",
                event,
            )
        frame.key_lines[key] = line
        frame.key = key

    def set_value(self, frame: _Frame, event: Any, value: Any) -> None:
        assert isinstance(frame.value, dict) and frame.key is not None
        if frame.key_is_merge:
            sources = value if isinstance(value, list) else [value]
            if not all(isinstance(s, dict) for s in sources):
                raise self.error("a merge key (<<) takes a mapping or a list of mappings", event)
            frame.merges.extend(sources)
        else:
            frame.value[frame.key] = value
        frame.key = None
        frame.key_is_merge = False

    def scalar(self, event: Any) -> tuple[str, Any]:
        """The resolved tag and the value of a scalar."""
        if event.tag in (None, "!"):
            if not event.implicit[0]:
                return _STR, event.value
            cached = self.plain.get(event.value)
            if cached is None:
                tag = self.parser.resolve(yaml.ScalarNode, event.value, event.implicit)  # type: ignore[no-untyped-call]
                cached = (tag, self.construct(tag, event))
                self.plain[event.value] = cached
            return cached
        return event.tag, self.construct(event.tag, event)

    def construct(self, tag: str, event: Any) -> Any:
        text = event.value
        if tag in (_STR, _VALUE, _MERGE):
            return text
        if tag == _TIMESTAMP:
            # kubectl keeps timestamps as the text they were written as.
            if _looks_like_timestamp(text):
                return text
            raise self.error(f"cannot read {text!r} as a timestamp", event)
        if tag == _BINARY:
            return self.binary(event)
        if tag not in _SCALAR_TAGS:
            raise self.error(f"unsupported tag {tag}", event)
        node = yaml.ScalarNode(tag, text, event.start_mark, event.end_mark)
        try:
            value = self.parser.construct_object(node)
        except (ValueError, KeyError, AttributeError, TypeError, yaml.YAMLError):
            raise self.error(f"cannot read {text!r} as {tag.removeprefix(_TAG)}", event) from None
        return value

    def binary(self, event: Any) -> str:
        try:
            return base64.b64decode(event.value, validate=False).decode()
        except (binascii.Error, ValueError):
            raise self.error("!!binary value is not base64 of UTF-8 text", event) from None


_TIMESTAMP_RESOLVER = next(
    regexp
    for regexp_tag, regexp in yaml.resolver.Resolver.yaml_implicit_resolvers["0"]
    if regexp_tag == _TIMESTAMP
)


def _looks_like_timestamp(text: str) -> bool:
    return _TIMESTAMP_RESOLVER.match(text) is not None


def load_all(text: str) -> list[Document]:
    """Each non-empty document of ``text``; raise YamlError when the stream cannot be read."""
    return _Reader(text).read()

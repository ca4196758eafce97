r"""What a jq program may use, and whether it is cheap enough to run in-process.

Called by :mod:`agentflows.engine.expressions` once per distinct program source, when a
Flow is validated. Two answers come from one tokenization of the source (strings, their
``\(...)`` interpolations and ``#`` comments are lexed as jq 1.7+ lexes them, so a string or a
comment that mentions ``env`` is fine while code that calls it is not):

**Refused** (:func:`refusal`): everything in jq's builtin list that reaches outside the
expression's scope. ``$ENV`` and ``env`` read the process environment (on a cluster the runner's
environment holds the Secrets its Agents reference); ``input``, ``inputs``, ``input_filename``
and ``input_line_number`` read jq's input stream; ``import``, ``include``, ``modulemeta``,
``get_search_list``, ``get_prog_origin`` and ``get_jq_origin`` read modules or paths on disk;
``halt``, ``halt_error``, ``debug`` and ``stderr`` write to or stop the host process;
``localtime``, ``strflocaltime`` read the host's time zone (``TZ`` and ``/etc/localtime``);
internal ``$__...`` variables other than ``$__loc__``. The check is on code tokens in call
position; an object key (``{env: 1}``, ``{env}``) and a field (``.env``) are data, not calls.

**Cheap** (:func:`is_cheap`): a program whose work and memory are bounded by a small multiple
of its input's size, so the caller may run it in its own process without a time bound. The
rest runs in the bounded worker pool of :mod:`agentflows.engine.jqsandbox`. The class is
deliberately narrow, because "no loops" alone is not enough: ``.s | . + . | . + . | ...``
doubles per stage (exponential in the program's length), ``{a: .x[], b: .y[]}`` and
``[.a[] + .a[]]`` are cartesian products, ``[.[] | select(.[])] | tojson`` is quadratic,
``"x" * 1e9``, ``.[1e9] = 1`` and ``[.a[]] - [.b[]]`` are huge or quadratic from one operator,
``strftime(.huge)`` overflows jq's stack. A cheap program therefore

- uses only the builtins in ``_CHEAP_BUILTINS`` (no ``def``, ``reduce``, ``foreach``, ``as``,
  ``label``, ``..``, ``range``, ``recurse``, ``limit``, ``while``, regular expressions,
  ``contains``/``index`` (quadratic), assignments, ``*``), calls ``join`` only with a string
  literal, and uses binary ``-`` and ``/`` only next to a number literal (so they are numeric);
- produces at most one value per input everywhere: ``,`` only directly inside an array or an
  object constructor (collected), and ``[]`` iteration only as the first stage of an array
  constructor that is a plain path (``[.items[] | select(.ok)]``, ``[.a[].b[]]``), whose
  outputs are disjoint parts of the input;
- has an amplification bound ``A <= CHEAP_AMPLIFICATION``: the product, over the program's
  ``|``-separated segments, of the larger of the segment's value sources (paths from ``.``,
  builtin calls weighted by how much larger their output can be than their input, e.g. 6 for
  ``tojson`` and the ``@formats``) and its comma count plus one. Every value the program builds
  is then at most ``A`` times its input (plus literals from the program), however it is shared.

:mod:`agentflows.engine.expressions` also bounds the input of the in-process path in bytes, so
the worst case in-process is a few megabytes and a few milliseconds.
"""

from __future__ import annotations

import dataclasses
import re

#: Largest amplification bound a program may have to run in-process.
CHEAP_AMPLIFICATION = 16

_SCOPE = "expressions read only their scope (.run, .nodes, .item, .items)"
_REFUSED: dict[str, str] = {
    "$ENV": "reads the process environment",
    "env": "reads the process environment",
    "input": "reads jq's input stream",
    "inputs": "reads jq's input stream",
    "input_filename": "reads jq's input stream",
    "input_line_number": "reads jq's input stream",
    "import": "loads jq modules from files",
    "include": "loads jq modules from files",
    "modulemeta": "loads jq modules from files",
    "get_search_list": "reads the module search path",
    "get_prog_origin": "reads the module search path",
    "get_jq_origin": "reads the module search path",
    "halt": "stops the host process's jq",
    "halt_error": "writes to the host process's stderr",
    "debug": "writes to the host process's stderr",
    "stderr": "writes to the host process's stderr",
    "localtime": "depends on the host's time zone (use gmtime)",
    "strflocaltime": "depends on the host's time zone (use strftime)",
}

#: Builtins whose output is at most about their input (``join`` is checked apart).
# fmt: off
_SIZE_PRESERVING = (
    "not", "length", "utf8bytelength", "type", "keys", "keys_unsorted", "has", "in", "getpath",
    "del", "delpaths", "select", "map", "map_values", "sort", "sort_by", "group_by", "unique",
    "unique_by", "min", "max", "min_by", "max_by", "reverse", "add", "any", "all", "first", "last",
    "error", "values", "nulls", "booleans", "numbers", "strings", "arrays", "objects", "iterables",
    "scalars", "fromjson", "toboolean", "ascii_downcase", "ascii_upcase", "ltrimstr", "rtrimstr",
    "trimstr", "startswith", "endswith", "trim", "ltrim", "rtrim", "from_entries", "floor", "ceil",
    "round", "sqrt", "fabs", "abs", "trunc", "pow", "log", "log10", "log2", "exp", "exp10", "exp2",
    "isnan", "isinfinite", "isnormal", "todate", "fromdate", "todateiso8601", "fromdateiso8601",
    "gmtime", "mktime", "join",
)
# fmt: on
#: Builtins allowed in-process, with how many times its input's size their output may be.
_CHEAP_BUILTINS: dict[str, int] = {
    **dict.fromkeys(("true", "false", "null", "empty", "now", "infinite", "nan"), 0),
    **dict.fromkeys(("tostring", "tojson"), 6),
    **dict.fromkeys(("to_entries", "with_entries"), 4),
    **dict.fromkeys(_SIZE_PRESERVING, 1),
}
_NEVER_CHEAP_KEYWORDS = frozenset(["def", "as", "reduce", "foreach", "label", "import", "include"])
_KEYWORDS = _NEVER_CHEAP_KEYWORDS | {"if", "then", "elif", "else", "end", "try", "catch", "and"}
_KEYWORDS |= {"or", "__loc__"}
_NEVER_CHEAP_OPS = frozenset(["..", "?//", "=", "|=", "+=", "-=", "*=", "/=", "%=", "//=", "*"])
#: Tokens after which ``-`` is unary and ``[`` starts an array constructor.
_VALUE_END = frozenset(["field", "ident", "var", "num", "str", "format"])
_CLOSERS = frozenset([")", "]", "}", "?", "."])

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<num>(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)
  | (?P<field>\.[A-Za-z_][A-Za-z0-9_]*)
  | (?P<var>\$(?:__loc__|[A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*))
  | (?P<format>@[A-Za-z0-9_]+)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*)
  | (?P<op>\?//|\.\.|!=|==|//=|//|\|=|\+=|-=|\*=|/=|%=|<=|>=|[.\[\](){}|,:;=<>+\-*/%?$])
    """,
    re.VERBOSE,
)


@dataclasses.dataclass(frozen=True)
class Token:
    """One jq token: ``kind`` is num, field, var, format, ident, op or str."""

    kind: str
    text: str
    #: For ``str``: whether it holds interpolations (their tokens follow it).
    interpolated: bool = False


def _skip_comment(source: str, at: int) -> int:
    # jq 1.7.1+: a backslash escapes the next character, so "\<newline>" continues a comment.
    end = len(source)
    while at < end and source[at] != "\n":
        if source[at] == "\\":
            at += 3 if source.startswith("\r\n", at + 1) else 2
        else:
            at += 1
    return at


def _scan_string(source: str, at: int) -> tuple[int, str]:
    """Scan a string literal from just after its opening quote (or an interpolation's end).

    Returns where the scan stopped and why: "closed" (after the closing quote), "interpolation"
    (after an interpolation's opening: code follows) or "open" (the source ended first).
    """
    end = len(source)
    while at < end:
        char = source[at]
        if char == '"':
            return at + 1, "closed"
        if char == "\\":
            if source.startswith("(", at + 1):
                return at + 2, "interpolation"
            at += 2
            continue
        at += 1
    return end, "open"


def tokenize(source: str) -> list[Token]:
    """The program's code tokens.

    An interpolation's tokens follow its string's ``str`` token, between an opening op token
    (backslash, parenthesis) and ``)``. Unknown characters become op tokens (jq refuses them).
    """
    tokens: list[Token] = []
    #: Open brackets; "interp" marks a string interpolation, whose ")" resumes the string.
    stack: list[str] = []
    at, end = 0, len(source)
    while at < end:
        char = source[at]
        if char == "#":
            at = _skip_comment(source, at)
            continue
        if char == '"' or (char == ")" and stack and stack[-1] == "interp"):
            start = at
            if char == ")":
                stack.pop()
                tokens.append(Token("op", ")"))
            at, stop = _scan_string(source, at + 1)
            opened = stop == "interpolation"
            if char == '"':
                tokens.append(Token("str", source[start:at], interpolated=opened))
            if opened:
                stack.append("interp")
                tokens.append(Token("op", "\\("))
            elif stop == "open":
                tokens.append(Token("op", _UNTERMINATED))
            continue
        match = _TOKEN.match(source, at)
        if match is None:
            tokens.append(Token("op", char))
            at += 1
            continue
        kind = match.lastgroup or "op"
        text = match.group()
        at = match.end()
        if kind == "space":
            continue
        if text in "([{":
            stack.append(text)
        elif text in ")]}" and stack:
            stack.pop()
        tokens.append(Token(kind, text))
    return tokens


_UNTERMINATED = '"'
_PAIRS = {")": ("(", "\\("), "]": ("[",), "}": ("{",)}


def self_contained(source: str, tokens: list[Token]) -> bool:
    """Whether ``source`` ends every string and bracket it opens and has no comment.

    Such a program can be checked inside parentheses together with others (one jq compile for
    many): nothing in it can close the parentheses or swallow what follows.
    """
    if "#" in source:
        return False
    stack: list[str] = []
    for token in tokens:
        text = token.text if token.kind == "op" else ""
        if text == _UNTERMINATED:
            return False
        if text in ("(", "[", "{", "\\("):
            stack.append(text)
        elif text in _PAIRS and (not stack or stack.pop() not in _PAIRS[text]):
            return False
    return not stack


def _key_positions(tokens: list[Token]) -> set[int]:
    """Indexes of identifiers that are object keys (``{a: ...}``, ``{a}``), not calls."""
    keys: set[int] = set()
    stack: list[str] = []
    for index, token in enumerate(tokens):
        text = token.text if token.kind == "op" else ""
        if text in ("(", "[", "{", "\\("):
            stack.append(text)
        elif text in (")", "]", "}") and stack:
            stack.pop()
        if token.kind != "ident" or not stack or stack[-1] != "{":
            continue
        before = tokens[index - 1].text if index else ""
        after = tokens[index + 1].text if index + 1 < len(tokens) else ""
        if before in ("{", ",") and after in (":", ",", "}"):
            keys.add(index)
    return keys


def refusal(tokens: list[Token]) -> str | None:
    """Why the program may not run (one sentence), or None when it may."""
    keys = _key_positions(tokens)
    for index, token in enumerate(tokens):
        name = token.text
        if token.kind == "var":
            if name in _REFUSED:
                return f"{name} {_REFUSED[name]}; {_SCOPE}"
            if name.startswith("$__") and name != "$__loc__":
                return f"{name} is internal to jq; {_SCOPE}"
        elif token.kind == "ident" and index not in keys and name in _REFUSED:
            return f"`{name}` is not available: it {_REFUSED[name]}; {_SCOPE}"
    return None


def _innermost(tokens: list[Token]) -> list[tuple[str, int]]:
    """For each token, its innermost open bracket (text, index) or ("", -1) at top level."""
    result: list[tuple[str, int]] = []
    stack: list[tuple[str, int]] = []
    for index, token in enumerate(tokens):
        text = token.text if token.kind == "op" else ""
        if text in (")", "]", "}") and stack:
            stack.pop()
        result.append(stack[-1] if stack else ("", -1))
        if text in ("(", "[", "{", "\\("):
            opener = "ctor" if text == "[" and not _postfix(tokens, index) else text
            stack.append((opener, index))
    return result


def _postfix(tokens: list[Token], index: int) -> bool:
    """Whether the token at ``index`` follows a value (``x[``, ``x -``), not an operator."""
    if index == 0:
        return False
    before = tokens[index - 1]
    if before.kind == "ident" and before.text in _KEYWORDS and before.text != "end":
        return False
    return before.kind in _VALUE_END or (before.kind == "op" and before.text in _CLOSERS)


def is_cheap(tokens: list[Token]) -> bool:
    """Whether the program is in the in-process class described in the module docstring."""
    inner = _innermost(tokens)
    keys = _key_positions(tokens)
    amplification = 1
    sources = commas = 0
    for index, token in enumerate(tokens):
        weight = _weight(tokens, index, inner, keys)
        if weight is None:
            return False
        if token.kind == "op" and token.text == "|":
            amplification *= max(1, sources, commas + 1)
            sources = commas = 0
        elif token.kind == "op" and token.text == ",":
            commas += inner[index][0] == "ctor"
        else:
            sources += weight
    amplification *= max(1, sources, commas + 1)
    return amplification <= CHEAP_AMPLIFICATION


def _weight(
    tokens: list[Token], index: int, inner: list[tuple[str, int]], keys: set[int]
) -> int | None:
    """How much a token adds to its segment's sources; None when it is never cheap."""
    token = tokens[index]
    text = token.text
    if token.kind == "ident":
        if index in keys:
            shorthand = tokens[index + 1].text in (",", "}")
            return 1 if shorthand else 0
        if text in _KEYWORDS:
            return None if text in _NEVER_CHEAP_KEYWORDS else 0
        if text == "join":
            return _join_weight(tokens, index)
        return _CHEAP_BUILTINS.get(text)
    if token.kind == "var":
        return 1 if text == "$__loc__" else None
    if token.kind in ("format", "str"):
        return 6 if token.kind == "format" or token.interpolated else 0
    if token.kind == "field":
        return 0 if _postfix(tokens, index) else 1
    if token.kind == "num":
        return 0
    return _op_weight(tokens, index, inner)


def _op_weight(tokens: list[Token], index: int, inner: list[tuple[str, int]]) -> int | None:
    text = tokens[index].text
    if text in _NEVER_CHEAP_OPS:
        return None
    if text == ".":
        return 0 if _postfix(tokens, index) else 1
    if text == ",":
        return 0 if inner[index][0] in ("ctor", "{") else None
    if text in ("-", "/") and _postfix(tokens, index):
        numeric = tokens[index - 1].kind == "num" or (
            index + 1 < len(tokens) and tokens[index + 1].kind == "num"
        )
        return 0 if numeric else None
    if text == "[" and _postfix(tokens, index) and tokens[index + 1 : index + 2] == [_CLOSE]:
        return 0 if _iteration_is_collected(tokens, index, inner) else None
    return 0


_CLOSE = Token("op", "]")
_PATH_KINDS = frozenset(["field", "num", "str"])


def _iteration_is_collected(tokens: list[Token], index: int, inner: list[tuple[str, int]]) -> bool:
    """``[]`` at ``index`` is in the first stage of an array constructor that is a plain path."""
    opener, start = inner[index]
    if opener != "ctor":
        return False
    depth = 0
    for token in tokens[start + 1 :]:
        text = token.text if token.kind == "op" else ""
        if depth == 0 and text in ("|", "]"):
            return True
        if text in ("(", "{", "\\(", ","):
            return False
        if text == "[":
            depth += 1
        elif text == "]":
            depth -= 1
        elif (token.kind not in _PATH_KINDS and text not in (".", "?")) or token.interpolated:
            return False
    return False


def _join_weight(tokens: list[Token], index: int) -> int | None:
    """``join("sep")`` adds at most the separator per element; any other ``join`` is not cheap."""
    window = tokens[index + 1 : index + 4]
    if len(window) == 3 and window[0].text == "(" and window[2].text == ")":
        literal = window[1]
        if literal.kind == "str" and not literal.interpolated:
            return len(literal.text) - 1
    return None

"""Shared pieces of the translation both ways: names, ids, jq access, models, schemas.

Used by :mod:`.components` and :mod:`.importer` (Agent Spec -> agentflows) and by
:mod:`.exporter` (back).
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentflows.agentspec import checks, errors, model
from agentflows.api import agent as agent_api
from agentflows.api import common, documents

_NOT_NAME = re.compile(r"[^a-z0-9-]+")
_NOT_ID = re.compile(r"[^a-z0-9]+")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Metadata key under which a ServerTool carries its Python implementation.
METADATA_KEY = "agentflows"
#: Items a ParallelMapNode runs at once (a MapNode runs one at a time).
PARALLEL_MAP_CONCURRENCY = 4
#: The items of a MapNode from ``[(iterated_a), (iterated_b), ...]``: an ``iterated_`` input
#: is a list or one value (``Union[T, List[T]]`` in the specification); lists are zipped and a
#: single value is given to every item. Without a list (no ``iterated_`` input, or only single
#: values) the sub-flow runs once.
MAP_ZIP = (
    '(map(select(type == "array") | length) | max) as $n '
    '| [range($n // 1) as $i | map(if type == "array" then .[$i] else . end)]'
)
#: The output that says on which branch a flow with several end branches ended.
BRANCH_OUTPUT = "branch_name"
#: jq turning any value into the text a message shows (a string as it is, else JSON).
AS_TEXT = 'if type == "string" then . else tojson end'


def resource_name(name: str, taken: set[str], limit: int = common.FLOW_NAME_MAX) -> str:
    """A DNS-1123 name made from a component name, unique among ``taken``."""
    stem = _NOT_NAME.sub("-", name.lower()).strip("-")[: limit - 4].strip("-") or "spec"
    candidate, n = stem, 2
    while candidate in taken:
        candidate, n = f"{stem}-{n}", n + 1
    taken.add(candidate)
    return candidate


def identifier(name: str, taken: set[str]) -> str:
    """A node or tool id made from a component name, unique among ``taken``."""
    stem = _NOT_ID.sub("_", name.lower()).strip("_")[:56] or "node"
    if not stem[0].isalpha():
        stem = f"n_{stem}"
    candidate, n = stem, 2
    while candidate in taken:
        candidate, n = f"{stem}_{n}", n + 1
    taken.add(candidate)
    return candidate


def field(title: str) -> str:
    """Jq access to a key."""
    return f".{title}" if _IDENT.match(title) else f".{json.dumps(title)}"


def by_name(ref: str, title: str) -> str:
    """Output ``title`` of a node declaring only it: that key of a JSON object holding it.

    As with several outputs, an object result is read by the output's name; any other result
    (a string, a list, an object without that key) is the output as a whole.
    """
    key = json.dumps(title)
    return f'({ref}.json | if type == "object" and has({key}) then .[{key}] else . end)'


def model_spec(
    config: model.OpenAiConfig | model.OpenAiCompatibleConfig,
    path: str,
    out: list[documents.Problem],
) -> agent_api.ModelSpec:
    """Our model spec for an LLM config."""
    if config.api_key:
        out.append(
            errors.problem(
                f"{path}.api_key",
                "a key written in the document is refused (it would be kept in the resources); "
                "OpenAiConfig reads OPENAI_API_KEY, an OpenAI-compatible endpoint needs none",
            )
        )
    api_base = config.url
    if isinstance(config, model.OpenAiCompatibleConfig):
        api_base = config.url if "://" in config.url else f"http://{config.url}"
        if not api_base.rstrip("/").endswith("/v1"):
            api_base = api_base.rstrip("/") + "/v1"
    if api_base and not re.match(agent_api.API_BASE_PATTERN, api_base):
        out.append(
            errors.problem(
                f"{path}.url",
                f"{api_base[:100]!r} is not a model endpoint: use http:// or https:// followed "
                "by a host, e.g. http://127.0.0.1:11434/v1",
            )
        )
        api_base = None
    params = config.default_generation_parameters or model.GenerationParameters()
    timeout = config.retry_policy.request_timeout if config.retry_policy else None
    return agent_api.ModelSpec(
        name=f"openai/{config.model_id}",
        api_base=api_base,
        temperature=params.temperature,
        top_p=params.top_p,
        max_tokens=params.max_tokens,
        **({"timeout_seconds": timeout} if timeout else {}),
    )


def object_schema(properties: list[model.Property]) -> dict[str, Any] | None:
    """The JSON Schema of an object with these properties (defaults make a field optional)."""
    if not properties:
        return None
    return {
        "type": "object",
        "properties": {str(p["title"]): dict(p) for p in properties},
        "required": [str(p["title"]) for p in properties if "default" not in p],
    }


def llm_output_schema(properties: list[model.Property]) -> dict[str, Any] | None:
    """What an LlmNode's reply must be: an object of its outputs, or one output's bare value.

    A single typed output may be answered as the value itself (``5`` for an integer output),
    as the reference runtime accepts; it is read with :func:`by_name`.
    """
    schema = object_schema(properties)
    if schema is None or len(properties) != 1:
        return schema
    return {"anyOf": [schema, dict(properties[0])]}


def substitute(template: str, bindings: dict[str, str], style: str = "{{ %s }}") -> str:
    """Replace ``{{name}}`` placeholders with ``style % expression``."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        return style % bindings[name] if name in bindings else match.group(0)

    return checks.PLACEHOLDER.sub(one, template)


def is_text_output(properties: list[model.Property] | None) -> bool:
    """True for no outputs, or one output of type string: the reply's text is the output."""
    return not properties or (len(properties) == 1 and properties[0].get("type") == "string")


def input_line(prop: dict[str, Any]) -> str:
    """The prompt line giving a top-level Agent input: ``name: {{ .run.input.name }}``."""
    title = str(prop["title"])
    default = f" // {json.dumps(prop['default'])}" if "default" in prop else ""
    return f"{title}: {{{{ .run.input{field(title)}{default} }}}}"


def jq_text(template: str, bindings: dict[str, str]) -> str:
    """A jq string expression for a ``{{name}}`` template: ``"Hi " + ((expr) | AS_TEXT)``."""
    parts: list[str] = []
    last = 0
    for match in checks.PLACEHOLDER.finditer(template):
        name = match.group(1)
        if name not in bindings:
            continue
        if match.start() > last:
            parts.append(json.dumps(template[last : match.start()], ensure_ascii=False))
        parts.append(f"(({bindings[name]}) | {AS_TEXT})")
        last = match.end()
    if last < len(template) or not parts:
        parts.append(json.dumps(template[last:], ensure_ascii=False))
    return " + ".join(parts)


def catch_transform(try_id: str, defaults: dict[str, Any], branch: str) -> str:
    """The output of a CatchExceptionNode from its ``catchErrors`` flow node ``try_id``.

    Failed: the outputs' defaults, the message as ``caught_exception_info`` and branch
    ``caught_exception_branch``. Succeeded: the sub-flow's outputs and the branch it ended on
    (``branch`` when it has one end branch, else its ``branch_name`` output).
    """
    return (
        f'=.nodes.{try_id}.json | if type == "object" and has("caughtError") then '
        f"{json.dumps(defaults, ensure_ascii=False)} + "
        f'{{"{checks.CAUGHT_INFO}": .caughtError, "{BRANCH_OUTPUT}": "{checks.CAUGHT_BRANCH}"}} '
        f'else {{"{BRANCH_OUTPUT}": {json.dumps(branch)}}} + . + {{"{checks.CAUGHT_INFO}": null}} '
        "end"
    )


#: The text of an A2A ``message/send`` reply (a Message, or a Task's artifacts and status).
A2A_TEXT = (
    'if type != "object" then error("the A2A agent did not answer with a JSON-RPC object") '
    'elif .error then error("A2A error: " + (.error.message // (.error | tojson))) '
    'else .result | (if .kind == "task" then [.artifacts[]?.parts[]?, .status.message.parts[]?] '
    'else .parts end) | map(select(.kind == "text") | .text) | join("\\n") end'
)


def a2a_body(titles: list[str]) -> dict[str, Any]:
    """The JSON-RPC ``message/send`` request: one text part of ``name: value`` lines."""
    text = "\n".join(f"{t}: {{{{ .args{field(t)} }}}}" for t in titles) or "Begin."
    message = {
        "kind": "message",
        "role": "user",
        "messageId": "{{ .args.message_id }}",
        "parts": [{"kind": "text", "text": text}],
    }
    return {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": message}}

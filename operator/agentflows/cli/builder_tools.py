"""The builder's tool belt: what ``agentflows draft``'s agent may do, and nothing else.

The builder is an ordinary agent turn run by our engine (:mod:`agentflows.cli.commands_draft`);
these tools are offered to it by the host (``LiveCapabilities(builtin_tools=...)``), never
through its spec, so no python, http or MCP tool can be given to it:

- ``validate_flow``: the draft's YAML checked as ``agentflows validate`` checks files
  (:func:`agentflows.cli.local.validate_loaded`, together with the existing resources the
  person gave), every problem with its path;
- ``dry_run_flow``: the draft run by the engine against the mock capabilities
  (:class:`agentflows.agents.mock.MockCapabilities`, what ``run --dry-run`` uses), with an
  input synthesized from ``spec.input`` unless one is given; the run's JSON comes back;
- ``explain_resource``: the CRD schema of a field (``Flow.spec.nodes.approval``), from the
  pydantic models through :func:`agentflows.api.crd.openapi_schema`, as ``kubectl explain``;
- ``save_flow``: write the YAML to the person's ``-o FILE``, or, without one, to a path the
  person confirms at a terminal. A draft that does not validate is never written;
- ``apply_flow``, only on a cluster: a server-side dry run, its diff shown to the person, and
  the apply once they confirm, as their kubeconfig identity (:mod:`agentflows.cli.builder_apply`).
  A draft that does not validate is never applied.

:class:`Belt` keeps what happened (the last draft that validated, its dry run, the file
written), which the session prints when the turn ends.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentflows.agents import tools
from agentflows.api import documents
from agentflows.api import flow as flow_api
from agentflows.cli import local
from agentflows.engine import capabilities, graph

if TYPE_CHECKING:  # the kube client is imported only when a session is given a cluster
    from agentflows.cli import builder_apply

#: The label problems of a draft carry (``draft.yaml#1 (Flow x): spec.nodes[0]...``).
DRAFT_SOURCE = "draft.yaml"
#: Longest YAML a tool takes (a Flow is far smaller).
MAX_YAML_CHARS = 200_000
#: Deepest level of fields ``explain_resource`` lists under the field asked for.
_EXPLAIN_FIELDS_SHOWN = 60

_YAML_ARG = {
    "type": "string",
    "maxLength": MAX_YAML_CHARS,
    "description": "The whole draft: one Flow, and any new Agents it needs, as YAML documents.",
}

#: Asks the person whether to write a draft to a path; False when nobody can be asked.
Confirm = Callable[[Path], bool]


@dataclasses.dataclass
class Draft:
    """A draft that validated: its YAML, its Flow, and the resolver it validated with."""

    yaml: str
    flow: flow_api.Flow
    resolver: graph.StaticResolver


@dataclasses.dataclass
class Belt:
    """The builder's tools (a :class:`~agentflows.agents.tools.ToolProvider`) and their record."""

    #: The resources the person gave (``-f``): the draft may use their Agents and Flows.
    existing: documents.LoadResult
    #: The person's ``-o FILE`` (None: saving asks through ``confirm``).
    output: Path | None
    confirm: Confirm
    #: The last draft that validated, and the dry run of it (when one ran).
    valid: Draft | None = None
    dry_run: dict[str, Any] | None = None
    dry_run_yaml: str | None = None
    saved: Path | None = None
    #: Every Flow that validated, by name, the last version of each (``--suggest`` shows all).
    drafts: dict[str, Draft] = dataclasses.field(default_factory=dict)
    #: Every problem list fed back, in order (what the model was told).
    problems_seen: list[list[str]] = dataclasses.field(default_factory=list)
    #: On a cluster: what ``apply_flow`` applies with (None: the tool is not offered).
    applier: builder_apply.Applier | None = None

    async def list_tools(self) -> list[tools.ToolDef]:
        """The four tools of the belt, and ``apply_flow`` on a cluster."""
        belt = [
            tools.ToolDef(
                "validate_flow",
                "Check a draft Flow (and any new Agents) as agentflows validate does. Returns "
                "valid, and every problem with its path. Call it after every change.",
                _object(yaml=_YAML_ARG),
                read_only=True,
            ),
            tools.ToolDef(
                "dry_run_flow",
                "Run the draft with the mock model and tools (nothing real is called) and "
                "return the run: phase, output, each node's phase, pending human requests. "
                "input is the run input (default: one synthesized from spec.input).",
                _object(
                    ("yaml",), yaml=_YAML_ARG, input={"description": "The run input (optional)."}
                ),
                read_only=True,
            ),
            tools.ToolDef(
                "explain_resource",
                "The schema of a field of Agent, Flow or FlowRun, as kubectl explain: its "
                "description, type and fields. path is like Flow.spec.nodes.approval or "
                "Agent.spec.tools.mcp.",
                _object(path={"type": "string", "maxLength": 300}),
                read_only=True,
            ),
            tools.ToolDef(
                "save_flow",
                "Write the draft to the person's file. Refused unless the draft validates, "
                "and unless the person gave -o FILE or confirms the path you give.",
                _object(
                    yaml=_YAML_ARG,
                    path={"type": "string", "maxLength": 4096, "description": "Where (no -o)."},
                    required=("yaml",),
                ),
            ),
        ]
        if self.applier is not None:
            belt.append(
                tools.ToolDef(
                    "apply_flow",
                    "Apply the draft to the person's namespace on the cluster, as the person: "
                    "a server-side dry run first, whose diff the person sees and must confirm. "
                    "Refused unless the draft validates; the API server's refusal is returned.",
                    _object(yaml=_YAML_ARG),
                )
            )
        return belt

    async def call(self, name: str, args: Any, ctx: capabilities.NodeContext) -> tools.ToolOutcome:
        """Run tool ``name`` of the belt."""
        args = args if isinstance(args, dict) else {}
        if name == "validate_flow":
            return tools.ToolOutcome.success(self.validate(str(args.get("yaml", ""))))
        if name == "dry_run_flow":
            return await self._dry_run(str(args.get("yaml", "")), args.get("input"))
        if name == "explain_resource":
            return explain(str(args.get("path", "")))
        if name == "save_flow":
            return await self._save(str(args.get("yaml", "")), args.get("path"))
        if name == "apply_flow" and self.applier is not None:
            return await self._apply(self.applier, str(args.get("yaml", "")))
        return tools.ToolOutcome.failure(f"no tool named {name!r}")

    def validate(self, text: str) -> dict[str, Any]:
        """``{valid, problems}`` of a draft; a valid one becomes :attr:`valid`."""
        draft, problems = self.check(text)
        if draft is not None:
            self._keep(draft)
            return {"valid": True, "problems": [], "flow": draft.flow.metadata.name}
        self.problems_seen.append(problems)
        return {"valid": False, "problems": problems}

    def _keep(self, draft: Draft) -> None:
        self.valid = draft
        self.drafts[draft.flow.metadata.name or ""] = draft

    def check(self, text: str) -> tuple[Draft | None, list[str]]:
        """The draft when ``text`` validates with the existing resources, else its problems."""
        loaded = documents.load_text(text, DRAFT_SOURCE)
        flows = loaded.of_kind(flow_api.Flow)
        combined = documents.LoadResult()
        combined.extend(self.existing)
        combined.extend(loaded)
        found = [p for p in local.validate_loaded(combined) if _in_draft(p)]
        problems = [str(p) for p in found]
        if not loaded.resources and not problems:
            problems = [f"{DRAFT_SOURCE}: no Agent or Flow in the YAML"]
        elif len(flows) != 1 and not problems:
            problems = [f"{DRAFT_SOURCE}: a draft holds exactly one Flow (it holds {len(flows)})"]
        if problems:
            return None, problems
        return Draft(text, flows[0], local.resolver_of(combined)), []

    def _checked(self, text: str, refusal: str) -> Draft | tools.ToolOutcome:
        """The draft of ``text``, kept as :attr:`valid`, or the failure ``refusal: problems``.

        A draft that does not validate has its problems recorded as fed back to the model.
        """
        draft, problems = self.check(text)
        if draft is None:
            self.problems_seen.append(problems)
            return tools.ToolOutcome.failure(f"{refusal}: " + "; ".join(problems))
        self._keep(draft)
        return draft

    async def _dry_run(self, text: str, input_value: Any) -> tools.ToolOutcome:
        draft = self._checked(text, "the draft does not validate, so it was not run")
        if isinstance(draft, tools.ToolOutcome):
            return draft
        result = await dry_run(draft, input_value)
        self.dry_run, self.dry_run_yaml = result, text
        return tools.ToolOutcome.success(result)

    async def _save(self, text: str, path: Any) -> tools.ToolOutcome:
        draft = self._checked(text, "not saved: the draft does not validate")
        if isinstance(draft, tools.ToolOutcome):
            return draft
        target = self.output
        if target is None:
            if not isinstance(path, str) or not path:
                return tools.ToolOutcome.failure(
                    "not saved: the person gave no -o FILE; give a path to ask them"
                )
            target = Path(path)
            if not await asyncio.to_thread(self.confirm, target):
                return tools.ToolOutcome.failure(
                    f"not saved: the person did not confirm writing {target} (the draft is "
                    "shown to them at the end of the session)"
                )
        try:
            target.write_text(text if text.endswith("\n") else text + "\n")
        except OSError as exc:
            return tools.ToolOutcome.failure(f"not saved: {target}: {exc.strerror or exc}")
        self.saved = target
        return tools.ToolOutcome.success({"saved": str(target)})

    async def _apply(self, applier: builder_apply.Applier, text: str) -> tools.ToolOutcome:
        draft = self._checked(text, "not applied: the draft does not validate")
        if isinstance(draft, tools.ToolOutcome):
            return draft
        return await applier.apply(text)


def _object(required: tuple[str, ...] | None = None, **properties: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required if required is not None else properties),
        "additionalProperties": False,
    }


def _in_draft(problem: documents.Problem) -> bool:
    return (problem.source or "").startswith(DRAFT_SOURCE)


async def dry_run(draft: Draft, input_value: Any = None) -> dict[str, Any]:
    """Run ``draft`` against the mock capabilities in memory; the run as JSON.

    The input defaults to one synthesized from ``spec.input``, as the mock synthesizes outputs.
    A run that stops at an approval or input node is Waiting, with its request shown.
    """
    from agentflows.agents import mock
    from agentflows.engine import run, store

    spec = draft.flow.spec
    if input_value is None:
        input_value = mock.synthesize(spec.input) if spec.input else {}
    bad_input = run.input_problems(spec.input, input_value)
    if bad_input:
        return {"phase": "NotRun", "inputProblems": bad_input, "input": input_value}
    memory = store.MemoryStore()
    outcome = await run.run_flow(
        graph.compile_flow(spec, draft.resolver),
        run_name="draft-dry-run",
        input_value=input_value,
        store_=memory,
        caps=mock.MockCapabilities(draft.resolver),
        resolver=draft.resolver,
    )
    checkpoint = memory.checkpoint
    return {
        "phase": outcome.phase.value,
        "message": outcome.message,
        "input": input_value,
        "output": outcome.output,
        "nodes": {key: record.phase.value for key, record in checkpoint.nodes.items()},
        "requests": {
            key: {"node": r.node, "kind": r.kind.value, "message": r.message}
            for key, r in checkpoint.requests.items()
        },
    }


def explain(path: str) -> tools.ToolOutcome:
    """The schema at ``Kind.field.field`` (array items are entered on the way)."""
    from agentflows.api import crd

    kind, _, rest = path.strip().partition(".")
    kinds = {r.kind.lower(): r for r in crd.RESOURCES}
    resource = kinds.get(kind.lower())
    if resource is None:
        have = ", ".join(r.kind for r in crd.RESOURCES)
        return tools.ToolOutcome.failure(f"{path!r}: start with a kind ({have}), e.g. Flow.spec")
    schema: Mapping[str, Any] = crd.openapi_schema(resource)
    walked = resource.kind
    for part in [p for p in rest.split(".") if p]:
        schema = _items(schema)
        fields = schema.get("properties") or {}
        if part not in fields:
            return tools.ToolOutcome.failure(
                f"{walked} has no field {part!r} (fields: {', '.join(fields) or 'none'})"
            )
        schema, walked = fields[part], f"{walked}.{part}"
    return tools.ToolOutcome.success(_explained(walked, schema))


def _items(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    while schema.get("type") == "array" and isinstance(schema.get("items"), Mapping):
        schema = schema["items"]
    return schema


def _explained(path: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    inner = _items(schema)
    required = set(inner.get("required") or [])
    fields = {
        name: f"{_type_of(sub)}{' (required)' if name in required else ''}: "
        + str(sub.get("description", ""))
        for name, sub in list((inner.get("properties") or {}).items())[:_EXPLAIN_FIELDS_SHOWN]
    }
    shown: dict[str, Any] = {
        "field": path,
        "type": _type_of(schema),
        "description": schema.get("description", ""),
    }
    for key in ("enum", "default", "minimum", "maximum", "pattern", "x-kubernetes-validations"):
        if key in inner:
            shown[key] = inner[key]
    if fields:
        shown["fields"] = fields
    plain: dict[str, Any] = json.loads(json.dumps(shown, default=str))
    return plain


def _type_of(schema: Mapping[str, Any]) -> str:
    if schema.get("type") == "array":
        return f"[]{_type_of(schema.get('items') or {})}"
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return "any"
    return str(schema.get("type", "any"))

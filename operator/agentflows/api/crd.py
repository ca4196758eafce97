"""Generate the CustomResourceDefinitions of Agent, Flow, FlowRun and Budget from the models.

Called by ``python -m agentflows.api.crd --write`` (run from the repository root; it regenerates
``crds/`` and ``config/crd/``), by the drift test ``tests/unit/test_crds.py`` and by tooling that
installs the CRDs. The models in this package are the single source of truth; nothing here
defines a field.

How a pydantic JSON Schema (``mode="validation"``: optionality as a user writes the object,
camelCase aliases) becomes a structural ``openAPIV3Schema``:

- every ``$ref`` is inlined (a field's own description wins over the model docstring);
- ``anyOf [X, null]`` becomes ``X``: optional fields are simply not ``required``;
- ``title`` is dropped, and so is every ``default``: pydantic applies the defaults when the
  operator and runner read an object, so stored objects stay exactly as users wrote them and
  ``has()`` in CEL rules means "the user set it" (defaults on free-form leaves would not be
  structural anyway);
- ``additionalProperties: false`` is dropped (the API server prunes or, with strict field
  validation, rejects unknown fields); typed maps keep ``additionalProperties: {schema}``;
- ``const`` becomes a one-value ``enum``; integers get ``format: int64``, numbers ``double``;
  numeric ``exclusiveMinimum``/``exclusiveMaximum`` (JSON Schema 2020-12) become OpenAPI 3.0's
  ``minimum`` plus boolean ``exclusiveMinimum``;
- free-form leaves (``common.FREE_FORM``) become ``{x-kubernetes-preserve-unknown-fields: true}``
  with a description and no type; no other node carries that marker;
- ``metadata`` is ``{type: object}`` (the API server owns its schema).

Anything the generator does not understand raises :class:`UnsupportedSchema` naming the path,
so a model change that would produce a non-structural CRD fails loudly instead of silently.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from agentflows import api
from agentflows.api import agent, agentsession, budget, errors, flow, flowrun

PRESERVE = "x-kubernetes-preserve-unknown-fields"
#: Header of every generated file; the drift test compares whole files, header included.
HEADER = (
    "# Generated from the pydantic models in operator/agentflows/api by\n"
    "# `python -m agentflows.api.crd --write`. Do not edit by hand.\n"
)
#: Where ``--write`` puts the CRDs, relative to the repository root; config/crd also gets a
#: kustomization.yaml (crds/ must hold only CRDs, because Helm applies every file in it).
CRDS_DIR = Path("crds")
KUSTOMIZE_DIR = Path("config/crd")

#: Keywords copied unchanged from the pydantic schema.
_COPIED = frozenset(
    {
        "description",
        "type",
        "format",
        "enum",
        "pattern",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "required",
        "x-kubernetes-validations",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type",
    }
)
#: Keywords dropped on purpose (see the module docstring).
_DROPPED = frozenset({"title", "default", "examples"})
_FORMATS = {"integer": "int64", "number": "double"}
_READY = '.status.conditions[?(@.type=="Ready")].status'


class UnsupportedSchema(errors.AgentflowsError, ValueError):
    """A model produced JSON Schema the generator cannot turn into a structural schema.

    Permanent: fix the model (or teach the generator) and regenerate.
    """


@dataclasses.dataclass(frozen=True)
class Resource:
    """Names and printer columns of one kind; the schema comes from ``model``."""

    model: type[BaseModel]
    kind: str
    plural: str
    short_name: str
    printer_columns: tuple[dict[str, Any], ...]
    #: Fields ``kubectl get --field-selector`` (and the API's fieldSelector) may select on.
    selectable_fields: tuple[str, ...] = ()

    @property
    def crd_name(self) -> str:
        """The CRD's metadata.name, e.g. ``agents.agentflows.io``."""
        return f"{self.plural}.{api.GROUP}"

    @property
    def file_name(self) -> str:
        """The generated file's name, e.g. ``agentflows.io_agents.yaml``."""
        return f"{api.GROUP}_{self.plural}.yaml"


def _column(
    name: str, path: str, type_: str, description: str, *, priority: int = 0
) -> dict[str, Any]:
    """A printer column; ``priority`` 1 shows only with ``kubectl get -o wide``."""
    column = {"name": name, "type": type_, "jsonPath": path, "description": description}
    return {**column, "priority": priority} if priority else column


_AGE = _column("Age", ".metadata.creationTimestamp", "date", "Time since creation.")
_READY_COLUMN = _column("Ready", _READY, "string", "Status of the Ready condition.")

RESOURCES: tuple[Resource, ...] = (
    Resource(
        model=agent.Agent,
        kind="Agent",
        plural="agents",
        short_name="ag",
        printer_columns=(
            _column("Model", ".spec.model.name", "string", "litellm model string."),
            _READY_COLUMN,
            _AGE,
        ),
    ),
    Resource(
        model=flow.Flow,
        kind="Flow",
        plural="flows",
        short_name="fl",
        printer_columns=(
            _READY_COLUMN,
            _column("Last Run", ".status.lastRun", "string", "Name of the newest run."),
            _column("Active", ".status.activeRuns", "integer", "Runs not yet finished."),
            _AGE,
        ),
    ),
    Resource(
        model=flowrun.FlowRun,
        kind="FlowRun",
        plural="flowruns",
        short_name="fr",
        selectable_fields=(".spec.flow",),
        printer_columns=(
            _column("Flow", ".spec.flow", "string", "The Flow being run."),
            _column("Phase", ".status.phase", "string", "Where the run is."),
            _column("Node", ".status.currentNode", "string", "A node that is running now."),
            _column("Attempt", ".status.attempt", "integer", "Runner attempt number."),
            _column("Duration", ".status.duration", "string", "Run time so far or in total."),
            _column(
                "Trigger", ".spec.trigger.type", "string", "What started the run (manual, ...)."
            ),
            _column(
                "Reason",
                ".status.reason",
                "string",
                "Why the run is in its phase (e.g. PodCreateFailed).",
                priority=1,
            ),
            _column("Message", ".status.message", "string", "What happened, in words.", priority=1),
            _AGE,
        ),
    ),
    Resource(
        model=agentsession.AgentSession,
        kind="AgentSession",
        plural="agentsessions",
        short_name="ases",
        printer_columns=(
            _column("Memory", ".spec.memory", "string", "The memory the session belongs to."),
            _column("Session", ".spec.session", "string", "The session, as evaluated."),
            _column("Turns", ".spec.turns", "integer", "Turns saved in total."),
            _column("Updated", ".spec.updatedAt", "date", "When a turn was last saved."),
            _AGE,
        ),
    ),
    Resource(
        model=budget.Budget,
        kind="Budget",
        plural="budgets",
        short_name="bud",
        printer_columns=(
            _column("Policy", ".spec.policy", "string", "Hold or Refuse new runs when used up."),
            _column("Day", ".status.day.used", "string", "Used/limit in the current UTC day."),
            _column(
                "Month", ".status.month.used", "string", "Used/limit in the current UTC month."
            ),
            _column("Exceeded", ".status.exceeded", "string", "Windows used up now."),
            _AGE,
        ),
    ),
)


class _Converter:
    """Turns one model's pydantic JSON Schema into a structural OpenAPI v3 schema."""

    def __init__(self, defs: dict[str, Any]) -> None:
        self._defs = defs

    def convert(
        self, node: dict[str, Any], path: str, active: tuple[str, ...] = ()
    ) -> dict[str, Any]:
        """Return the structural form of ``node``; ``path`` names it in errors."""
        node, active = self._flatten(node, path, active)
        if node.get(PRESERVE):
            return self._free_form(node, path)
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in _DROPPED or (key == "additionalProperties" and value is False):
                continue
            if key in _COPIED:
                out[key] = copy.deepcopy(value)
            elif key == "const":
                out["enum"] = [value]
            elif key in ("exclusiveMinimum", "exclusiveMaximum"):
                bound = "minimum" if key == "exclusiveMinimum" else "maximum"
                out[bound] = value
                out[key] = True
            elif key == "properties":
                out[key] = {
                    name: self._property(sub, f"{path}.{name}", active)
                    for name, sub in value.items()
                }
            elif key == "items":
                out[key] = self.convert(value, f"{path}[]", active)
            elif key == "additionalProperties" and isinstance(value, dict):
                out[key] = self.convert(value, f"{path}{{}}", active)
            else:
                raise UnsupportedSchema(f"{path}: cannot express {key}={value!r} in a CRD schema")
        if "enum" in out and "type" not in out:
            out["type"] = _enum_type(out["enum"], path)
        if "type" not in out:
            raise UnsupportedSchema(
                f"{path}: no type and not free-form; the schema is not structural"
            )
        if out["type"] in _FORMATS:
            out.setdefault("format", _FORMATS[out["type"]])
        return out

    def _property(self, node: dict[str, Any], path: str, active: tuple[str, ...]) -> dict[str, Any]:
        out = self.convert(node, path, active)
        if not out.get("description"):
            raise UnsupportedSchema(f"{path}: every field needs a description (kubectl explain)")
        return out

    def _flatten(
        self, node: dict[str, Any], path: str, active: tuple[str, ...]
    ) -> tuple[dict[str, Any], tuple[str, ...]]:
        """Inline ``$ref`` and unwrap ``anyOf [X, null]``; the outer keys win over X's."""
        while True:
            if "$ref" in node:
                name = node["$ref"].removeprefix("#/$defs/")
                if name in active:
                    raise UnsupportedSchema(f"{path}: recursive model {name} cannot be inlined")
                if name not in self._defs:
                    raise UnsupportedSchema(f"{path}: unresolvable reference {node['$ref']}")
                outer = {k: v for k, v in node.items() if k != "$ref"}
                node, active = {**self._defs[name], **outer}, (*active, name)
            elif "anyOf" in node:
                variants = [v for v in node["anyOf"] if v != {"type": "null"}]
                if len(variants) != 1:
                    raise UnsupportedSchema(
                        f"{path}: unions other than 'X or null' have no structural form"
                    )
                outer = {k: v for k, v in node.items() if k != "anyOf"}
                node = {**variants[0], **outer}
            else:
                return node, active

    @staticmethod
    def _free_form(node: dict[str, Any], path: str) -> dict[str, Any]:
        extra = set(node) - _DROPPED - {"description", PRESERVE}
        if extra:
            raise UnsupportedSchema(f"{path}: a free-form leaf cannot also have {sorted(extra)}")
        return {"description": node.get("description", ""), PRESERVE: True}


def _enum_type(values: list[Any], path: str) -> str:
    types = {type(v) for v in values}
    if types == {str}:
        return "string"
    if types == {int}:
        return "integer"
    raise UnsupportedSchema(f"{path}: enum values {values!r} need one type")


def openapi_schema(resource: Resource) -> dict[str, Any]:
    """Return the structural ``openAPIV3Schema`` of one resource."""
    source = resource.model.model_json_schema(by_alias=True, mode="validation")
    # The API server owns these three; the models' versions (Literal defaults, a metadata
    # subset with extra="allow") describe what Python reads, not what the server validates.
    source["properties"].update(
        apiVersion={"type": "string", "description": f"Always {api.API_VERSION}."},
        kind={"type": "string", "description": f"Always {resource.kind}."},
    )
    source["properties"].pop("metadata", None)
    schema = _Converter(source.pop("$defs", {})).convert(source, resource.kind)
    # The API server rejects anything but the type on metadata, even a description.
    schema["properties"]["metadata"] = {"type": "object"}
    return schema


def build_crd(resource: Resource) -> dict[str, Any]:
    """Return the apiextensions.k8s.io/v1 CustomResourceDefinition of one resource."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": resource.crd_name},
        "spec": {
            "group": api.GROUP,
            "names": {
                "kind": resource.kind,
                "listKind": f"{resource.kind}List",
                "plural": resource.plural,
                "singular": resource.kind.lower(),
                "shortNames": [resource.short_name],
                "categories": [api.CATEGORY],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema(resource)},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [dict(c) for c in resource.printer_columns],
                    **(
                        {"selectableFields": [{"jsonPath": f} for f in resource.selectable_fields]}
                        if resource.selectable_fields
                        else {}
                    ),
                }
            ],
        },
    }


def build_crds() -> list[dict[str, Any]]:
    """Return the CRDs of Agent, Flow, FlowRun, AgentSession and Budget, in that order."""
    return [build_crd(resource) for resource in RESOURCES]


def render_yaml(crds: Sequence[dict[str, Any]]) -> str:
    """Render documents as multi-document YAML: keys sorted, lines unwrapped, deterministic."""
    return yaml.safe_dump_all(
        list(crds), sort_keys=True, explicit_start=True, width=1_000_000, allow_unicode=True
    )


def rendered_files(*, kustomization: bool) -> dict[str, str]:
    """Return file name -> content of the generated directory (with a kustomization or not)."""
    files = {r.file_name: HEADER + render_yaml([build_crd(r)]) for r in RESOURCES}
    if kustomization:
        document = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [r.file_name for r in RESOURCES],
        }
        files["kustomization.yaml"] = HEADER + yaml.safe_dump(document, sort_keys=False)
    return files


def write(directory: Path, *, kustomization: bool = False) -> list[Path]:
    """Write one file per CRD (and optionally a kustomization.yaml) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, content in rendered_files(kustomization=kustomization).items():
        target = directory / name
        target.write_text(content, encoding="utf-8")
        written.append(target)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """Print the CRDs as YAML, or with ``--write`` regenerate crds/ and config/crd/."""
    parser = argparse.ArgumentParser(prog="python -m agentflows.api.crd", description=main.__doc__)
    parser.add_argument(
        "--write", action="store_true", help="write crds/ and config/crd/ under --root"
    )
    parser.add_argument(
        "--root", type=Path, default=Path.cwd(), help="repository root (default: cwd)"
    )
    args = parser.parse_args(argv)
    if not args.write:
        sys.stdout.write(render_yaml(build_crds()))
        return 0
    for path in [
        *write(args.root / CRDS_DIR),
        *write(args.root / KUSTOMIZE_DIR, kustomization=True),
    ]:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

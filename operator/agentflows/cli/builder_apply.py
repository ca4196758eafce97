"""The builder's ``apply_flow`` on a cluster: a server-side dry run, the diff, the person's yes.

Offered only when ``agentflows draft`` is given a cluster (``-n``, ``--kubeconfig`` or
``--context``), with the person's own kubeconfig client, so the API server's RBAC and
admission decide what the builder may change — never an account of ours. Like ``kubectl diff``
then ``kubectl apply --server-side``:

1. every resource of the draft (its Flow and any new Agents) is applied with ``dryRun=All``
   (server-side apply, field manager :data:`FIELD_MANAGER`): the API server validates it
   against the CRDs and admission, and answers what the object would become;
2. the diff between each live object (none: it is new) and that answer is shown to the
   person, who is asked at a terminal (nobody to ask, no terminal: no);
3. only on a yes is the same apply sent without ``dryRun``.

A refusal (a 403 of RBAC, a 422 of the CRD's rules) is the tool's failure with the API
server's words, which the model is told and the session prints on stderr; nothing is applied
and the person is not asked.
The apply takes over the fields the draft sets from other managers (``force=true``): the
person saw the diff of exactly that before saying yes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
from collections.abc import Callable
from typing import Any

import yaml

from agentflows.agents import tools
from agentflows.cli import views
from agentflows.kube import client as kube

#: The field manager of the builder's applies (``kubectl get -o yaml --show-managed-fields``).
FIELD_MANAGER = "agentflows-draft"
APPLY_PATCH = "application/apply-patch+yaml"
#: The kinds a draft may hold, by their plural.
PLURALS = {"Agent": "agents", "Flow": "flows"}

#: Shows the person ``diff`` and asks ``question``; False when nobody can be asked.
Ask = Callable[[str, str], bool]


@dataclasses.dataclass
class Applier:
    """Applies drafts to one namespace as the person (see module docstring)."""

    api: kube.Client
    namespace: str
    ask: Ask
    #: What was applied, as ``Kind name`` (the session prints it).
    applied: list[str] = dataclasses.field(default_factory=list)
    #: The API server's refusals, as the model was told them (the session prints them too:
    #: the person should not learn of a 403 only through the model's words).
    refused: list[str] = dataclasses.field(default_factory=list)

    async def apply(self, text: str) -> tools.ToolOutcome:
        """Dry-run, diff, ask, apply the documents of a draft that validated."""
        try:
            documents = self._documents(text)
        except ValueError as exc:
            return tools.ToolOutcome.failure(f"not applied: {exc}")
        diffs: list[str] = []
        for document in documents:
            label = _label(document)
            try:
                after = await self._apply(document, dry_run=True)
                before = await self._live(document)
            except kube.ApiError as exc:
                return self._refused(
                    f"not applied: the API server refused the dry run of {label} in namespace "
                    f"{self.namespace}: {exc}"
                )
            diffs.append(_diff(label, before, after))
        shown = "\n".join(d for d in diffs if d)
        if not shown:
            return tools.ToolOutcome.success(
                {"applied": [], "message": "the cluster already holds the draft as it is"}
            )
        labels = ", ".join(_label(d) for d in documents)
        question = f"Apply {labels} to namespace {self.namespace}?"
        if not await asyncio.to_thread(self.ask, shown, question):
            return tools.ToolOutcome.failure(
                "not applied: the person did not confirm after seeing the server-side dry "
                "run's diff (the draft is shown to them at the end of the session)"
            )
        for document in documents:
            try:
                await self._apply(document, dry_run=False)
            except kube.ApiError as exc:
                return self._refused(
                    f"not applied: {_label(document)}: {exc} (applied before it: "
                    f"{', '.join(self.applied) or 'nothing'})"
                )
            self.applied.append(_label(document))
        applied = {"applied": list(self.applied), "namespace": self.namespace}
        return tools.ToolOutcome.success(applied)

    def _refused(self, message: str) -> tools.ToolOutcome:
        self.refused.append(message)
        return tools.ToolOutcome.failure(message)

    def _documents(self, text: str) -> list[dict[str, Any]]:
        """The draft's documents, each placed in :attr:`namespace` (another one is refused)."""
        documents = [d for d in yaml.safe_load_all(text) if d]
        for document in documents:
            kind = document.get("kind")
            if kind not in PLURALS:
                raise ValueError(f"kind {kind!r}: apply_flow applies only {', '.join(PLURALS)}")
            metadata = document.setdefault("metadata", {})
            namespace = metadata.get("namespace")
            if namespace not in (None, self.namespace):
                raise ValueError(
                    f"{_label(document)}: metadata.namespace is {namespace!r}; apply_flow "
                    f"applies to namespace {self.namespace!r} only (leave it out)"
                )
            metadata["namespace"] = self.namespace
        return documents

    def _path(self, document: dict[str, Any]) -> str:
        name = str(document["metadata"].get("name") or "")
        return kube.path_of(PLURALS[str(document["kind"])], self.namespace, name)

    async def _apply(self, document: dict[str, Any], *, dry_run: bool) -> dict[str, Any]:
        params = {"fieldManager": FIELD_MANAGER, "force": "true"}
        if dry_run:
            params["dryRun"] = "All"
        answer: dict[str, Any] = await self.api.request(
            "PATCH", self._path(document), document, params=params, content_type=APPLY_PATCH
        )
        return answer

    async def _live(self, document: dict[str, Any]) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = await self.api.get(self._path(document))
        except kube.ApiError as exc:
            if exc.not_found:
                return None
            raise
        return found


def _label(document: dict[str, Any]) -> str:
    return f"{document.get('kind')} {(document.get('metadata') or {}).get('name')}"


def _shown(obj: dict[str, Any] | None) -> list[str]:
    """What the diff compares: kind, name, labels, annotations and spec (not the server's)."""
    if obj is None:
        return []
    metadata = obj.get("metadata") or {}
    kept = {k: metadata[k] for k in ("name", "namespace", "labels", "annotations") if k in metadata}
    shown = {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "metadata": kept}
    shown["spec"] = obj.get("spec") or {}
    return views.dump(shown, "yaml").splitlines(keepends=True)


def _diff(label: str, before: dict[str, Any] | None, after: dict[str, Any]) -> str:
    """``kubectl diff``'s unified diff of one object ("" when nothing changes)."""
    lines = difflib.unified_diff(
        _shown(before),
        _shown(after),
        f"{label} (live)" if before is not None else f"{label} (new)",
        f"{label} (after apply)",
    )
    return "".join(lines)

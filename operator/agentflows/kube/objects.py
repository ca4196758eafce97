"""What agentflows creates in Kubernetes: names, labels, owner references, idempotent writes.

The one owner of these rules, used by the operator (pods, snapshots), the runner (offloaded
outputs), and the triggers (CronJobs, FlowRuns). Kubernetes allows object names of up to 253
characters but label values of only 63, and a CronJob's name of 52 (its Jobs append 11): every
name or label derived from a user's name goes through :func:`fit` or :func:`label_value`, which
keep short values as they are and shorten long ones with a hash suffix, so two long names never
collide and a Flow named with 63 characters or more works like any other.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from agentflows import api as api_group
from agentflows.api import wellknown
from agentflows.kube import client as kube

#: Longest object name (a DNS subdomain).
NAME_MAX = 253
#: Longest label value.
LABEL_VALUE_MAX = 63
#: Longest CronJob name (the Job controller appends an 11-character suffix).
CRONJOB_NAME_MAX = 52


_NOT_DNS = re.compile(r"[^a-z0-9.-]")


def _digest(value: str, chars: int) -> str:
    return hashlib.sha1(value.encode()).hexdigest()[:chars]


def fit(value: str, limit: int = NAME_MAX, *, digest_chars: int = 10) -> str:
    """``value`` if it fits in ``limit`` characters, else its head and a hash of all of it."""
    if len(value) <= limit:
        return value
    head = value[: limit - digest_chars - 1].rstrip("-.")
    return f"{head}-{_digest(value, digest_chars)}"


def label_value(value: str) -> str:
    """``value`` made a valid label value (<= 63 characters), keeping it readable."""
    return fit(value, LABEL_VALUE_MAX)


def derived(base: str, suffix: str) -> str:
    """The name ``<base><suffix>`` (``suffix`` kept whole), shortened to a valid object name."""
    return fit(base, NAME_MAX - len(suffix)) + suffix


def pod_name(run: str, attempt: int) -> str:
    """The runner pod of an attempt: ``<run>-<attempt>``."""
    return derived(run, f"-{attempt}")


def snapshot_name(run: str) -> str:
    """The ConfigMap holding a run's snapshot: ``<run>-snapshot``."""
    return derived(run, "-snapshot")


def offload_prefix(run: str, key: str) -> str:
    """Name prefix of the ConfigMaps holding the value stored under ``key`` of run ``run``."""
    suffix = f"-out-{_digest(key, 10)}"
    # each part appends "-" and up to 4 digits
    return fit(run, NAME_MAX - 5 - len(suffix)) + suffix


def session_name(memory: str, session: str) -> str:
    """The AgentSession of a session: ``<memory>-<session, DNS-safe>-<hash of both>``."""
    readable = _NOT_DNS.sub("-", session.lower()).replace(".", "-").strip("-")
    digest = _digest(f"{memory}\0{session}", 10)
    head = f"{memory}-{readable}"[: NAME_MAX - len(digest) - 1].rstrip("-.")
    return f"{head}-{digest}"


def session_labels(memory: str, session: str) -> dict[str, str]:
    """Labels of an AgentSession (the exact session is in its spec: labels hold 63 characters)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", session)[:LABEL_VALUE_MAX].strip("-_.")
    return {
        wellknown.MANAGED_BY: wellknown.MANAGER,
        wellknown.MEMORY: label_value(memory),
        wellknown.SESSION: safe,
    }


def cronjob_name(flow: str, trigger: str) -> str:
    """``<flow>-<trigger>``, made DNS-safe and shortened with a hash suffix to <= 52 chars."""
    plain = f"{flow}-{trigger}"
    safe = _NOT_DNS.sub("-", plain.lower())
    if safe == plain and len(plain) <= CRONJOB_NAME_MAX:
        return plain
    head = safe[: CRONJOB_NAME_MAX - 9].strip("-.")
    return f"{head}-{_digest(plain, 8)}"


def run_labels(run: str, flow: str) -> dict[str, str]:
    """Labels on everything created for a run."""
    return {
        wellknown.MANAGED_BY: wellknown.MANAGER,
        wellknown.FLOW: label_value(flow),
        wellknown.RUN: label_value(run),
    }


def flow_selector(flow: str) -> str:
    """A label selector for what belongs to a Flow."""
    return f"{wellknown.FLOW}={label_value(flow)}"


def owner_reference(
    obj: Mapping[str, Any], *, controller: bool = True, block: bool = True
) -> dict[str, Any]:
    """An owner reference to ``obj``: what is created for it is garbage-collected with it.

    ``block`` (``blockOwnerDeletion``) needs the right to update the owner's finalizers, which
    the operator has and a runner has not.
    """
    meta = obj["metadata"]
    reference: dict[str, Any] = {
        "apiVersion": obj.get("apiVersion") or api_group.API_VERSION,
        "kind": obj.get("kind") or "FlowRun",
        "name": meta["name"],
        "uid": meta["uid"],
    }
    if block:
        reference["blockOwnerDeletion"] = True
    if controller:
        reference["controller"] = True
    return reference


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    """True when ``obj`` names the object with ``uid`` among its owners."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid for ref in refs)


async def create_or_get(api: kube.Client, collection: str, body: Mapping[str, Any]) -> Any:
    """Create; when an object of that name exists, return it as stored (the first one wins)."""
    try:
        return await api.create(collection, body)
    except kube.ApiError as exc:
        if not exc.conflict:
            raise
        return await api.get(f"{collection}/{body['metadata']['name']}")


async def create_or_replace(
    api: kube.Client, collection: str, body: Mapping[str, Any], keys: tuple[str, ...] = ("data",)
) -> Any:
    """Create; when an object of that name exists, replace its ``keys`` (a merge patch)."""
    try:
        return await api.create(collection, body)
    except kube.ApiError as exc:
        if not exc.conflict:
            raise
        patch = {key: body[key] for key in keys if key in body}
        return await api.merge_patch(f"{collection}/{body['metadata']['name']}", patch)

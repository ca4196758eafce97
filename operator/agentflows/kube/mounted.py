"""The ConfigMaps a run reads, as its pod sees them: one projected volume the operator mounts.

The runner's identity may create and patch the ConfigMaps of its own run (the admission policy
confines those writes) but may not ``get`` any ConfigMap: a ``get`` cannot be confined by
admission, and would reach other runs' outputs and other teams' configuration. What a run reads
is known when its pod is made, so the operator lists it in the pod
(:func:`agentflows.controller.pods.runner_pod`) and the kubelet, not the runner, reads it:

- the snapshot ``<run>-snapshot`` (:mod:`agentflows.kube.snapshot`), which must be there;
- each key a ``files[].configMapKeyRef`` of the run's Agents and Flows names (optional: a
  missing ConfigMap or key is the file's error, at the node that reads it, as before);
- each part of the values earlier attempts offloaded (:func:`agentflows.kube.status_store.
  offloaded_parts`; optional: one that is gone is the run's ``StateLost``, as before).

Each key is the file ``<root>/<configmap>/<key>``, ``root`` being
:data:`agentflows.api.runner.RUNNER_CONFIGMAPS_ROOT` (``AGENTFLOWS_CONFIGMAPS_ROOT`` moves it:
the development cluster's process kubelet, which mounts nothing, points it at its copy). A value
the runner offloads itself during an attempt stays in its memory, so nothing is read back
through the API.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterable, Mapping
from typing import Any

from agentflows.api import runner as runner_api

#: The pod volume (and its mount) holding the run's ConfigMaps.
VOLUME = "run-configmaps"


def volume(
    required: Iterable[tuple[str, str]], optional: Iterable[tuple[str, str]]
) -> dict[str, Any]:
    """The projected volume of ``(configmap, key)`` pairs, each at ``<configmap>/<key>``.

    A ConfigMap both required and optional is required. Sources are sorted, so the pod of the
    same run is the same pod.
    """
    keys: dict[str, set[str]] = {}
    needed: set[str] = set()
    for name, key in required:
        keys.setdefault(name, set()).add(key)
        needed.add(name)
    for name, key in optional:
        keys.setdefault(name, set()).add(key)
    sources = [
        {
            "configMap": {
                "name": name,
                "items": [{"key": key, "path": f"{name}/{key}"} for key in sorted(keys[name])],
                **({} if name in needed else {"optional": True}),
            }
        }
        for name in sorted(keys)
    ]
    return {"name": VOLUME, "projected": {"sources": sources}}


def mount() -> dict[str, Any]:
    """The runner container's read-only mount of :func:`volume`."""
    return {"name": VOLUME, "mountPath": runner_api.RUNNER_CONFIGMAPS_ROOT, "readOnly": True}


class Mounted:
    """Reads the keys of the run's ConfigMaps from the pod's volume."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> Mounted:
        """The pod's volume, or where ``AGENTFLOWS_CONFIGMAPS_ROOT`` says it is."""
        root = environ.get(runner_api.CONFIGMAPS_ROOT_ENV) or runner_api.RUNNER_CONFIGMAPS_ROOT
        return cls(pathlib.Path(root))

    def read(self, name: str, key: str) -> bytes | None:
        """The value of ``key`` of ConfigMap ``name``; None when the pod was not given it."""
        if "/" in name or "/" in key or name in ("", ".", "..") or key in ("", ".", ".."):
            return None
        try:
            return (self.root / name / key).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def text(self, name: str, key: str) -> str | None:
        """:meth:`read` as UTF-8 text (the way ``data`` values are stored)."""
        found = self.read(name, key)
        return None if found is None else found.decode("utf-8", errors="replace")

"""Fill a pod's projected volume of ConfigMaps from the API server, as a kubelet does.

For tests that run ``agentflows runner`` as a process rather than in a pod (the runner reads
its run's ConfigMaps from a volume, :mod:`agentflows.kube.mounted`): each source's ``items``
are written to their paths; a missing ConfigMap or key of an ``optional`` source is skipped,
of another one is an error, as the kubelet leaves such a pod ContainerCreating.
"""

from __future__ import annotations

import base64
import shutil
from pathlib import Path
from typing import Any

from agentflows.kube import client as kube_client


async def fill(api: kube_client.Client, namespace: str, volume: dict[str, Any], root: Path) -> None:
    """Write ``volume``'s ConfigMap keys under ``root`` (emptied first: a new pod's volume)."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for source in volume["projected"]["sources"]:
        config_map = source["configMap"]
        optional = bool(config_map.get("optional"))
        try:
            found = await api.get(kube_client.path_of("configmaps", namespace, config_map["name"]))
        except kube_client.ApiError as exc:
            if exc.not_found and optional:
                continue
            raise
        data = {k: str(v).encode() for k, v in (found.get("data") or {}).items()}
        data |= {k: base64.b64decode(v) for k, v in (found.get("binaryData") or {}).items()}
        for item in config_map["items"]:
            if item["key"] not in data:
                if optional:
                    continue
                raise AssertionError(f"{config_map['name']} has no key {item['key']}")
            path = root / item["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data[item["key"]])

"""The kustomize copy of the chart's monitoring objects: ``config/prometheus``.

The chart's templates (``charts/agentflows/templates/monitoring.yaml`` and
``prometheus-rule.yaml``) are the one source of the PodMonitors and the PrometheusRule; this
renders them with the default values, as kustomize users get them (namespace
``agentflows-system``, the labels of ``config/manager``), and ``hack/control-plane
write-monitoring`` writes them to ``config/prometheus``. A unit test checks the files are current.
The dashboard JSON lives in ``config/prometheus`` itself and the chart reads it from there.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "agentflows"
CONFIG = REPO / "config" / "prometheus"
NAMESPACE = "agentflows-system"
#: What the chart renders with default values plus these, and the file each kind goes to.
_SETS = (
    "monitoring.podMonitor.enabled=true",
    "monitoring.rules.enabled=true",
    "webhook.enabled=true",
)
FILES = {"PodMonitor": "pod-monitors.yaml", "PrometheusRule": "prometheus-rule.yaml"}
_HEADER = (
    "# Rendered from charts/agentflows/templates with the default values by\n"
    "# `hack/control-plane write-monitoring`: edit the chart template, not this file.\n"
)


def render_chart(helm: Path, *sets: str) -> list[dict[str, Any]]:
    """The chart's monitoring objects as a cluster with the Prometheus Operator gets them."""
    args = [arg for value in (*_SETS, *sets) for arg in ("--set", value)]
    done = subprocess.run(
        [
            str(helm),
            "template",
            "agentflows",
            str(CHART),
            "-n",
            NAMESPACE,
            "--api-versions",
            "monitoring.coreos.com/v1",
            "--show-only",
            "templates/monitoring.yaml",
            "--show-only",
            "templates/prometheus-rule.yaml",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"helm template failed: {done.stderr}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def _as_kustomize(document: dict[str, Any]) -> dict[str, Any]:
    """Drop the release's labels: config/manager's pods carry only name and component."""
    kept = ("app.kubernetes.io/name", "app.kubernetes.io/component")
    labels = document["metadata"]["labels"]
    document["metadata"]["labels"] = {key: labels[key] for key in kept}
    selector = document.get("spec", {}).get("selector", {}).get("matchLabels")
    if selector is not None:
        selector.pop("app.kubernetes.io/instance")
    return document


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the alert expressions) as ``|`` blocks, as in the template."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _string)


def kustomize_files(helm: Path) -> dict[str, str]:
    """File name in config/prometheus -> its text, as rendered from the chart now."""
    by_file: dict[str, list[dict[str, Any]]] = {name: [] for name in FILES.values()}
    for document in render_chart(helm):
        if document["kind"] in FILES:
            by_file[FILES[document["kind"]]].append(_as_kustomize(document))
    return {
        name: _HEADER
        + yaml.dump_all(documents, Dumper=_Dumper, sort_keys=False, width=200, explicit_start=True)
        for name, documents in by_file.items()
    }


def write(helm: Path) -> list[Path]:
    """Write config/prometheus's rendered files; return their paths."""
    written = []
    for name, text in kustomize_files(helm).items():
        path = CONFIG / name
        path.write_text(text)
        written.append(path)
    return written

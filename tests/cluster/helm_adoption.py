"""Handing CRDs that ``kubectl apply`` created to a Helm release, and taking them back.

Helm refuses to install an object it does not own ("exists and cannot be imported into the
current release"). The documented way to adopt one is to label it
``app.kubernetes.io/managed-by=Helm`` and annotate it with the release's name and namespace
(charts/agentflows/README.md, "From kustomize to Helm"). The cluster tests share one control
plane in which other tests apply crds/ directly, so a test that installs the chart adopts the
CRDs first and, after ``helm uninstall`` (which keeps them), removes the ownership again.
"""

from __future__ import annotations

from tests.cluster.harness import Cluster

CRDS = tuple(f"crd/{plural}.agentflows.io" for plural in ("agents", "flows", "flowruns"))
MANAGED_BY = "app.kubernetes.io/managed-by"
RELEASE_NAME = "meta.helm.sh/release-name"
RELEASE_NAMESPACE = "meta.helm.sh/release-namespace"


def _existing(cluster: Cluster) -> list[str]:
    found = cluster.kubectl("get", *CRDS, "-o", "name", "--ignore-not-found")
    return [f"crd/{line.split('/', 1)[1]}" for line in found.stdout.split()]


def adopt_crds(cluster: Cluster, release: str, namespace: str) -> list[str]:
    """Make the release ``namespace/release`` the owner of the agentflows CRDs that exist."""
    crds = _existing(cluster)
    if crds:
        cluster.kubectl("label", *crds, f"{MANAGED_BY}=Helm", "--overwrite")
        cluster.kubectl(
            "annotate", *crds, f"{RELEASE_NAME}={release}",
            f"{RELEASE_NAMESPACE}={namespace}", "--overwrite",
        )  # fmt: skip
    return crds


def release_crds(cluster: Cluster) -> None:
    """Remove any Helm ownership from the agentflows CRDs, so another release may adopt them."""
    crds = _existing(cluster)
    if crds:
        cluster.kubectl("label", *crds, f"{MANAGED_BY}-")
        cluster.kubectl("annotate", *crds, f"{RELEASE_NAME}-", f"{RELEASE_NAMESPACE}-")

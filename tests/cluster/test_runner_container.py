"""A FlowRun's runner in a container of the image the ``Dockerfile`` builds, on the real node.

The module runs on the session's shared real node (the default of tests/cluster/conftest.py),
which has ``agentflows:<appVersion>`` from the project's ``Dockerfile`` in its containerd. The
operator runs from the checkout with its ServiceAccount's token, as in the other operator tests;
what runs in a container is every runner pod it creates: under runc, as the chart's non-root
user, with the read-only root filesystem and the restricted Pod Security Standard the namespace
enforces, reaching the API server through the ``kubernetes`` Service.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.cluster.harness import wait_for
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import FlowRuns, python_tool

from devcluster import appimage  # isort: skip  (hack/ is on sys.path)

pytestmark = pytest.mark.cluster


# What a tool can do to the filesystem and who it is, reported by the tool itself.
_PROBE = """
import json, os, sys
json.load(sys.stdin)
try:
    open("/probe", "w")
    root = "written"
except OSError as error:
    root = error.strerror
scratch = os.environ.get("TMPDIR", "/tmp")
with open(os.path.join(scratch, "probe"), "w") as handle:
    handle.write("ok")
print(json.dumps({"root": root, "uid": os.getuid(), "scratch": "written"}))
"""


def test_a_flowrun_succeeds_in_a_runner_container_of_the_dockerfiles_image(
    runs: FlowRuns,
) -> None:
    runs.apply(
        {
            "kind": "Flow",
            "metadata": {"name": "probe"},
            "spec": {
                "nodes": [{"id": "probe", "tool": python_tool(_PROBE, {})}],
                "output": "=.nodes.probe.json",
            },
        },
        {"kind": "FlowRun", "metadata": {"name": "probe-1"}, "spec": {"flow": "probe"}},
    )
    status = runs.wait_phase("probe-1", "Succeeded", "Failed", timeout=300)
    assert status["phase"] == "Succeeded", status
    # The kernel refuses the write (a read-only root), the tool runs as the chart's user, and
    # the emptyDir at /tmp is the one place a tool may write.
    assert status["output"] == {"root": "Read-only file system", "uid": 65532, "scratch": "written"}

    # the runner may write Succeeded before the kubelet has reported its container's start
    # (under load, its status sync lags): wait for the pod's status to name the container
    def reported() -> tuple[Any, Any] | None:
        [pod] = runs.pods("probe-1")
        [container] = pod.status.container_statuses or [None]
        return (pod, container) if container is not None and container.container_id else None

    pod, container = wait_for(reported, timeout=120, what="the runner container's status")
    assert container.container_id.startswith("containerd://")
    assert container.image.endswith(f"agentflows:{appimage.app_version()}")
    assert pod.spec.security_context.run_as_user == 65532 or (
        pod.spec.containers[0].security_context.run_as_user == 65532
    )

"""A Flow's ``runner.files``: volumes of reference files mounted read-only in the runner pod."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agentflows.api import flow as flow_api
from agentflows.api import flowrun as flowrun_api
from agentflows.cli import main as cli
from agentflows.controller import pods, settings
from agentflows.kube import mounted

RUN = {
    "apiVersion": "agentflows.io/v1alpha1",
    "kind": "FlowRun",
    "metadata": {"name": "answer-1", "namespace": "team", "uid": "0000-1111"},
}
#: The status of a run whose pod is its first: nothing offloaded yet.
NO_STATUS = flowrun_api.FlowRunStatus()


def _flow(files: list[dict[str, Any]]) -> str:
    lines = [
        "apiVersion: agentflows.io/v1alpha1",
        "kind: Flow",
        "metadata: {name: answer}",
        "spec:",
        "  nodes: [{id: only, transform: '.'}]",
        "  runner:",
        f"    files: {files}",
    ]
    return "\n".join(lines) + "\n"


def test_files_volumes_are_mounted_read_only_under_the_files_root() -> None:
    flow = flow_api.FlowSpec.model_validate(
        {
            "nodes": [{"id": "only", "transform": "."}],
            "runner": {
                "files": [
                    {"name": "handbook", "configMap": {"name": "handbook"}},
                    {
                        "name": "docs",
                        "persistentVolumeClaim": {"claimName": "docs"},
                        "subPath": "policies",
                    },
                ]
            },
        }
    )

    pod = pods.runner_pod(
        RUN, 1, "answer", {"answer": flow}, {}, settings.OperatorConfig(), status=NO_STATUS
    )

    # (the run's ConfigMaps volume has its own tests: test_runner_configmaps_volume.py)
    assert [v for v in pod["spec"]["volumes"] if v["name"] != mounted.VOLUME] == [
        {"name": "tmp", "emptyDir": {}},
        {"name": "files-handbook", "configMap": {"name": "handbook"}},
        {"name": "files-docs", "persistentVolumeClaim": {"claimName": "docs", "readOnly": True}},
    ]
    [container] = pod["spec"]["containers"]
    assert [m for m in container["volumeMounts"] if m["name"] != mounted.VOLUME] == [
        {"name": "tmp", "mountPath": "/tmp"},
        {
            "name": "files-handbook",
            "mountPath": "/var/run/agentflows/files/handbook",
            "readOnly": True,
        },
        {
            "name": "files-docs",
            "mountPath": "/var/run/agentflows/files/docs",
            "readOnly": True,
            "subPath": "policies",
        },
    ]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize(
    ("files", "problem"),
    [
        (
            [{"name": "etc", "hostPath": {"path": "/etc"}}],
            "spec.runner.files[0].hostPath: unknown field",
        ),
        (
            [{"name": "docs"}],
            "spec.runner.files[0]: set exactly one of configMap or persistentVolumeClaim",
        ),
        (
            [
                {
                    "name": "docs",
                    "configMap": {"name": "docs"},
                    "persistentVolumeClaim": {"claimName": "docs"},
                }
            ],
            "spec.runner.files[0]: set exactly one of configMap or persistentVolumeClaim",
        ),
        (
            [{"name": "docs", "persistentVolumeClaim": {"claimName": "docs", "readOnly": False}}],
            "spec.runner.files[0].persistentVolumeClaim.readOnly: Input should be True",
        ),
        (
            [{"name": "docs", "configMap": {"name": "docs"}, "subPath": "../../etc"}],
            "spec.runner.files[0]: subPath '../../etc' must be a path inside the volume "
            "(no leading / and no ..)",
        ),
        (
            [{"name": "Docs", "configMap": {"name": "docs"}}],
            "spec.runner.files[0].name: String should match pattern",
        ),
        (
            [{"name": "a", "configMap": {"name": "x"}}, {"name": "a", "configMap": {"name": "y"}}],
            "spec.runner: files: names must be unique (a repeated)",
        ),
    ],
)
def test_a_files_volume_that_is_not_a_read_only_configmap_or_claim_is_refused_with_its_path(
    tmp_path: Path, files: list[dict[str, Any]], problem: str
) -> None:
    document = tmp_path / "flow.yaml"
    document.write_text(_flow(files))

    result = CliRunner().invoke(cli.main, ["validate", str(document)])

    assert result.exit_code == 2, result.output
    assert problem in result.output
    assert "Traceback" not in result.output

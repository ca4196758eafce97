"""The README's "On a cluster" commands, run verbatim on the dev control plane.

The shell blocks of the section are read from README.md and every command runs as written
through ``bash -c``: the Helm path first, then the kustomize path, each followed by the
"Then, either way" block and the approval block. The only changes are those a reader makes,
all listed here and applied textually:

- ``team-a`` becomes a fresh namespace per path, and the Helm path's ``agentflows-system`` a
  fresh one too (the control plane is shared by the tests of a session);
- ``<run>`` becomes the name the preceding ``agentflows start`` printed;
- who runs it: ``KUBECONFIG`` is admin's for installing and binding (see :func:`_actor`),
  ``alice``'s (only the built-in ``edit`` role in the namespace) for creating Flows and runs and
  reading them, ``bob``'s (bound to ``agentflows-approver``) for deciding.

``helm`` on ``PATH`` is the pinned binary of ``hack/control-plane build-helm``; ``agentflows``
is this checkout's. What other tests installed with kubectl (the CRDs at least) is adopted by
the release first, as the chart README says. Everything installed is removed again, the CRDs
excepted.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.cluster.harness import REPO, Cluster, adopt_into_helm_release, wait_for

sys.path.insert(0, str(REPO / "hack"))

from devcluster import build

pytestmark = pytest.mark.cluster

SECTION = "## On a cluster"
README_NAMESPACE = "team-a"
README_SYSTEM = "agentflows-system"
RUN = "<run>"
EDITOR = "alice"
APPROVER = "bob"
ADMIN_COMMANDS = (
    "kubectl create namespace", "kubectl label", "helm ", "kubectl create rolebinding",
    "agentflows crds", "kubectl apply -k",
)  # fmt: skip
APPROVER_COMMANDS = ("agentflows approve",)


def _section_blocks() -> list[str]:
    """The ```sh blocks of the README's "On a cluster" section, in order."""
    text = (REPO / "README.md").read_text()
    section = text.split(f"\n{SECTION}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```sh\n(.*?)^```$", section, flags=re.S | re.M)


def _commands(block: str) -> list[str]:
    """One entry per command line; a here-document stays with its command."""
    commands: list[str] = []
    lines = iter(block.splitlines())
    for line in lines:
        if not line.strip():
            continue
        heredoc = re.search(r"<<'(\w+)'", line)
        if heredoc:
            body = []
            for more in lines:
                body.append(more)
                if more == heredoc.group(1):
                    break
            line = "\n".join([line, *body])
        commands.append(line)
    return commands


def _actor(command: str) -> str:
    if command.startswith(ADMIN_COMMANDS):
        return "admin"
    return APPROVER if command.startswith(APPROVER_COMMANDS) else EDITOR


class Reader:
    """Runs README commands as a reader would, with the substitutions of the module docstring."""

    def __init__(self, cluster: Cluster, bindir: Path, home: Path) -> None:
        self.cluster = cluster
        self.replacements: dict[str, str] = {}
        self.env = {
            **os.environ,
            "PATH": f"{bindir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
            "HOME": str(home),
            "HELM_CACHE_HOME": str(home / "helm-cache"),
            "HELM_CONFIG_HOME": str(home / "helm-config"),
            "HELM_DATA_HOME": str(home / "helm-data"),
        }

    def run(self, command: str, expect: int = 0, user: str | None = None) -> str:
        for old, new in self.replacements.items():
            command = command.replace(old, new)
        user = user or _actor(command)
        env = {**self.env, "KUBECONFIG": str(self.cluster.kubeconfig(user))}
        done = subprocess.run(
            ["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True,
            timeout=400, check=False,
        )  # fmt: skip
        print(f"[{user}]$ {command}\n{done.stdout}{done.stderr}", flush=True)
        assert done.returncode == expect, f"{command!r} exited {done.returncode}: {done.stderr}"
        return done.stdout + done.stderr

    def run_block(self, block: str) -> dict[str, str]:
        """Run every command of ``block``; the output of each, by command as written."""
        return {command: self.run(command) for command in _commands(block)}

    def started_run(self, outputs: dict[str, str], flow: str) -> str:
        """The run name that ``agentflows start FLOW`` printed (its first line)."""
        (printed,) = (out for cmd, out in outputs.items() if f"agentflows start {flow}" in cmd)
        name = printed.splitlines()[0]
        self.replacements[RUN] = name
        return name


@pytest.fixture
def reader(control_plane: Cluster, tmp_path: Path) -> Reader:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "helm").symlink_to(build.helm_binary())
    return Reader(control_plane, bindir, tmp_path)


def _rendered(team: str, system: str) -> list[dict[str, Any]]:
    """The manifests the README's ``helm install`` (with our namespaces) would install."""
    done = subprocess.run(
        [str(build.helm_binary()), "template", "agentflows", "charts/agentflows", "-n", system,
         "--set", f"runnerNamespaces={{{team}}}"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def _delete_namespace(cluster: Cluster, name: str) -> None:
    cluster.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=false")


def _gone(cluster: Cluster, name: str) -> bool:
    try:
        cluster.core().read_namespace(name)
    except client.ApiException as exc:
        return exc.status == 404
    return False


def _follow_the_readme(reader: Reader, install: str, blocks: list[str]) -> None:
    """The install block, then "Then, either way", then the approval block."""
    then, approval = blocks[2], blocks[3]
    outputs = reader.run_block(install)
    started = next(out for cmd, out in outputs.items() if "agentflows start hello" in cmd)
    assert '"greeting": "Hello, Ada"' in started and '"phase": "Succeeded"' in started, started
    reader.started_run(outputs, "hello")
    outputs = reader.run_block(then)
    listed = next(out for cmd, out in outputs.items() if "kubectl get flowruns" in cmd)
    assert "Succeeded" in listed, listed
    commands = _commands(approval)
    decide = next(c for c in commands if c.startswith("agentflows approve"))
    before: dict[str, str] = {}
    for command in commands[: commands.index(decide)]:
        before[command] = reader.run(command)
        if "agentflows start ship" in command:  # the next commands name the run it printed
            reader.started_run(before, "ship")
    # The editor may create runs but not decide them: the same command as alice is refused.
    refused = reader.run(decide, expect=2, user=EDITOR)
    assert 'User "alice" cannot patch resource "flowruns/status"' in refused, refused
    for command in commands[commands.index(decide) :]:
        reader.run(command)
    del reader.replacements[RUN]


@pytest.fixture
def blocks() -> list[str]:
    found = _section_blocks()
    assert len(found) == 4, found  # Helm, kustomize, then either way, approval
    assert found[0].lstrip().startswith("kubectl create namespace agentflows-system")
    assert "helm install" in found[0] and "kubectl apply -k config/default" in found[1]
    return found


@pytest.fixture
def cleanup(control_plane: Cluster) -> Iterator[list[str]]:
    """Namespaces to delete at the end; the kustomize install and Helm's CRD ownership go too."""
    namespaces: list[str] = []
    yield namespaces
    for kustomization in ("config/manager", "config/rbac", "config/rbac/users", "config/policies"):
        control_plane.kubectl("delete", "-k", str(REPO / kustomization), "--ignore-not-found")
    for name in namespaces:
        _delete_namespace(control_plane, name)
    for name in (*namespaces, README_SYSTEM):
        wait_for(lambda n=name: _gone(control_plane, n), 180, f"namespace {name} to go")


def test_the_readme_on_a_cluster_commands_work_verbatim_with_helm_then_kustomize(
    control_plane: Cluster, reader: Reader, blocks: list[str], cleanup: list[str]
) -> None:
    helm_team, system = f"team-{uuid.uuid4().hex[:8]}", f"af-system-{uuid.uuid4().hex[:8]}"
    cleanup.extend([helm_team, system])
    reader.replacements = {README_NAMESPACE: helm_team, README_SYSTEM: system}
    # As other tests of the session leave them: CRDs applied with kubectl, which Helm adopts.
    control_plane.kubectl("apply", "-f", str(REPO / "crds"))
    adopted = adopt_into_helm_release(
        control_plane, _rendered(helm_team, system), "agentflows", system
    )
    assert "CustomResourceDefinition/flowruns.agentflows.io" in adopted, adopted
    _follow_the_readme(reader, blocks[0], blocks)
    reader.run(f"helm uninstall agentflows -n {system} --wait")

    kustomize_team = f"team-{uuid.uuid4().hex[:8]}"
    cleanup.append(kustomize_team)
    reader.replacements = {README_NAMESPACE: kustomize_team}
    _follow_the_readme(reader, blocks[1], blocks)

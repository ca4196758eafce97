"""Images for the real node, built locally: no container registry is reachable from here.

:func:`pause_image` builds the sandbox image containerd's ``sandbox_image`` names
(:data:`PAUSE_IMAGE`): one static Go program (``pause/main.go``) that holds a pod's namespaces
and exits on SIGTERM, cached as ``<cache>/pause-<PAUSE_TAG>/pause.tar``. :func:`write_archive`
writes a one-layer image in the ``docker save`` layout (``manifest.json`` with ``RepoTags``),
which ``ctr images import`` reads and whose short names (``agentflows/pause:1``) it normalises
the way the kubelet's image references are normalised, so a pod's ``image:`` finds it.
:func:`import_image` runs that import into containerd's ``k8s.io`` namespace.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
import tempfile
from pathlib import Path

from devcluster import build

PAUSE_TAG = "1"
PAUSE_IMAGE = f"agentflows/pause:{PAUSE_TAG}"
_PAUSE_SOURCE = Path(__file__).resolve().parent / "pause" / "main.go"


def _layer(files: dict[str, tuple[bytes, int]]) -> bytes:
    """Return an uncompressed tar layer holding ``files`` (path -> (content, mode))."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, (content, mode) in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(content)
            info.mode = mode
            tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def write_archive(
    target: Path, tag: str, files: dict[str, tuple[bytes, int]], entrypoint: list[str]
) -> Path:
    """Write a one-layer ``docker save`` archive of ``files`` tagged ``tag`` to ``target``."""
    layer = _layer(files)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "hack/devcluster/images.py"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": ["layer.tar"]}]
    members = {
        config_name: config_bytes,
        "layer.tar": layer,
        "manifest.json": json.dumps(manifest).encode(),
    }
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    with tarfile.open(partial, mode="w") as tar:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(content))
    partial.replace(target)
    return target


def pause_image() -> Path:
    """Return the cached pause image archive, building the static program first if needed."""
    target = build.cache_root() / f"pause-{PAUSE_TAG}" / "pause.tar"
    if target.is_file():
        return target
    with tempfile.TemporaryDirectory(prefix="agentflows-pause-build-") as tmp:
        workdir = Path(tmp)
        (workdir / "go.mod").write_text("module agentflows.invalid/pause\n\ngo 1.22\n")
        (workdir / "main.go").write_bytes(_PAUSE_SOURCE.read_bytes())
        build.run_go(["build", "-trimpath", "-ldflags", "-s -w", "-o", "pause", "."], workdir)
        binary = (workdir / "pause").read_bytes()
    return write_archive(target, PAUSE_IMAGE, {"pause": (binary, 0o755)}, ["/pause"])


def import_image(socket: Path, archive: Path) -> None:
    """Import ``archive`` into the ``k8s.io`` namespace of the containerd at ``socket``."""
    completed = subprocess.run(
        ["ctr", "--address", str(socket), "-n", "k8s.io", "images", "import", str(archive)],
        capture_output=True,
        text=True,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(
            f"ctr images import {archive} failed (exit {completed.returncode}):\n"
            f"{completed.stdout}{completed.stderr}"
        )

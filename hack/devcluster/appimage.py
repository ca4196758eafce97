"""The agentflows image, built from the project's own ``Dockerfile`` with no registry in reach.

The ``Dockerfile``'s default base, ``python:3.11-slim``, lives in a registry this machine cannot
reach, so :func:`base_image` makes a stand-in from Debian packages: ``mmdebstrap`` writes a
bookworm ``minbase`` with ``python3`` (3.11, as the default base has) straight into an empty
``buildah`` container, which is committed as :data:`BASE_IMAGE`. The default base keeps its
Python in ``/usr/local``; a virtual environment created *at* ``/usr/local`` gives the stand-in the
same layout (``/usr/local/bin/python``, ``pip``, ``lib/python3.11/site-packages``), which is what
the ``Dockerfile``'s ``pip install --prefix=/install`` and ``COPY --from=build /install
/usr/local`` rely on. The stand-in trusts the certificate authorities this host trusts
(``/usr/local/share/ca-certificates``), so its ``pip`` reaches the package index through the
same egress as the host's. It is cached in buildah's storage under a tag derived from everything
it is made of (:func:`_base_key`): a second build finds it and returns at once.

:func:`app_image` then runs ``buildah bud`` on the ``Dockerfile`` itself, with only
``--build-arg BASE_IMAGE=...`` changed — the same file ``docker build .`` reads — tags it
``agentflows:<appVersion>`` (the chart's ``appVersion``, which is what the chart's Deployment and
the operator's default runner image name), and saves it as a ``docker save`` archive in the
binary cache, which :func:`load_into_node` imports into a real node's containerd (``up --node
real`` and the cluster tests' real node do).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from devcluster import build, images, node

ROOT = Path(__file__).resolve().parents[2]
SUITE = "bookworm"
PACKAGES = ("python3", "python3-venv", "ca-certificates")
BASE_REPOSITORY = "localhost/agentflows-python"
_HOST_CAS = Path("/usr/local/share/ca-certificates")
_HOST_SOURCES = Path("/etc/apt/sources.list.d/debian.sources")
_EXCLUDED = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*", "/usr/share/info/*")


@dataclass(frozen=True)
class Built:
    """An image archive ready for ``ctr images import``, with what building it cost."""

    tag: str
    archive: Path
    seconds: float
    size_bytes: int


def app_version() -> str:
    """The chart's ``appVersion``: the tag the chart and the operator's default runner use."""
    chart = (ROOT / "charts" / "agentflows" / "Chart.yaml").read_text()
    match = re.search(r'^appVersion:\s*"?([^"\s]+)"?', chart, re.MULTILINE)
    if match is None:
        raise RuntimeError("charts/agentflows/Chart.yaml has no appVersion")
    return match.group(1)


def _run(*argv: str) -> str:
    completed = subprocess.run(argv, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv[:3])} ... failed (exit {completed.returncode}):\n"
            f"{completed.stdout[-4000:]}{completed.stderr[-4000:]}"
        )
    return completed.stdout.strip()


def _base_key() -> str:
    """A digest of everything the base is made of: suite, packages, this recipe, the host's CAs."""
    digest = hashlib.sha256()
    digest.update(f"{SUITE} {' '.join(PACKAGES)} {' '.join(_EXCLUDED)} venv-at-usr-local".encode())
    for ca in sorted(_HOST_CAS.glob("*.crt")):
        digest.update(ca.name.encode() + ca.read_bytes())
    return digest.hexdigest()[:12]


def _image_exists(reference: str) -> bool:
    return bool(
        subprocess.run(
            ["buildah", "images", "-q", reference], capture_output=True, text=True, check=False
        ).stdout.strip()
    )


def base_image() -> str:
    """Return the Debian + Python stand-in for ``python:3.11-slim``, building it if needed."""
    reference = f"{BASE_REPOSITORY}:3.11-{SUITE}-{_base_key()}"
    if _image_exists(reference):
        return reference
    container = _run("buildah", "from", "scratch")
    try:
        root = _run("buildah", "mount", container)
        hooks = [
            f'cp -r {_HOST_CAS}/. "$1/usr/local/share/ca-certificates/"',
            'chroot "$1" update-ca-certificates',
            'chroot "$1" python3 -m venv /usr/local',
        ]
        _run(
            "mmdebstrap",
            "--quiet",
            "--mode=root",
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            *(f"--dpkgopt=path-exclude={pattern}" for pattern in _EXCLUDED),
            *(f"--customize-hook={hook}" for hook in hooks),
            SUITE,
            root,
            str(_HOST_SOURCES),
        )
        _run("buildah", "umount", container)
        _run(
            "buildah",
            "config",
            "--env",
            "PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--cmd",
            "python3",
            container,
        )
        _run("buildah", "commit", "--quiet", container, reference)
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
    return reference


def _source_key() -> str:
    """A digest of what ``docker build .`` copies and runs: a changed source means a new image."""
    digest = hashlib.sha256()
    sources = [
        ROOT / name for name in ("Dockerfile", "pyproject.toml", "README.md", "constraints.txt")
    ]
    sources += sorted(
        p for p in (ROOT / "operator").rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )
    for path in sources:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def app_image() -> Built:
    """Build ``agentflows:<appVersion>`` from the ``Dockerfile`` and save it for the node.

    The archive is named for a digest of the sources (:func:`_source_key`), so an unchanged tree
    finds it at once and a changed one is built again.
    """
    started = time.monotonic()
    tag = f"agentflows:{app_version()}"
    archive = build.cache_root() / "images" / f"agentflows-{_source_key()}.tar"
    if archive.is_file():
        return Built(tag, archive, time.monotonic() - started, archive.stat().st_size)
    base = base_image()
    _run(
        "buildah",
        "bud",
        "--quiet",
        "--pull=never",
        "--network=host",
        "--layers=false",
        f"--build-arg=BASE_IMAGE={base}",
        f"--tag={tag}",
        str(ROOT),
    )
    archive.parent.mkdir(parents=True, exist_ok=True)
    for stale in archive.parent.glob("agentflows-*.tar"):
        stale.unlink()
    partial = archive.with_name(archive.name + ".partial")
    partial.unlink(missing_ok=True)
    _run("buildah", "push", "--quiet", tag, f"docker-archive:{partial}:{tag}")
    partial.replace(archive)
    # The previous build's image lost its tag to this one: drop it, or every build keeps one.
    subprocess.run(["buildah", "rmi", "--prune"], capture_output=True, check=False)
    return Built(tag, archive, time.monotonic() - started, archive.stat().st_size)


def load_into_node(state_dir: Path) -> Built:
    """Build (or find) the image; import it into the real node's containerd in ``state_dir``."""
    built = app_image()
    images.import_image(node.containerd_socket(state_dir), built.archive)
    return built

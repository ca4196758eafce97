"""Build and cache the pinned binaries: the control plane's, helm, prometheus, promtool, jaeger.

Called by ``hack/control-plane build`` and, lazily, by :mod:`devcluster.controlplane` when it needs
the binaries. Kubernetes is built from the Go module proxy through a throwaway wrapper module that
requires ``k8s.io/kubernetes`` and replaces every staging module (``k8s.io/api`` and friends, read
at build time from the published ``go.mod`` of that release) by its ``v0.<minor>.<patch>`` tag,
because the release's own ``go.mod`` points them at ``./staging`` directories that a module
download does not have. etcd is built the same way, since its ``go.mod`` has ``replace`` lines
too and ``go install pkg@version`` refuses those. helm's ``go.mod`` has no ``replace`` lines, so
it is a plain ``go install helm.sh/helm/v3/cmd/helm@<version>``; it is not a control-plane binary
and only the chart tests need it (``hack/control-plane build-helm``, :func:`helm_binary`).
Prometheus's ``go.mod`` has no ``replace`` lines either: ``prometheus`` and ``promtool`` are a
plain ``go install`` of ``github.com/prometheus/prometheus/cmd/...@<module version>`` (module
``v0.3MM.P`` is Prometheus ``3.MM.P``), built without ``builtinassets`` (no web UI: the tests only
use the HTTP API) and with ``remove_all_sd`` (static and file discovery only, which is all a
loopback scrape needs, and it leaves out the cloud SDKs that dominate the build). Only the
monitoring tests need them (``hack/control-plane build-prometheus``, :func:`prometheus_binaries`).
Jaeger (v2, ``cmd/jaeger``: an OpenTelemetry Collector build with memory storage and a query
API) is built through a wrapper module like etcd, because its ``go.mod`` has a ``replace`` line;
only the tracing tests need it (``hack/control-plane build-jaeger``, :func:`jaeger_binary`). A
cold build (empty module and build caches) took 930 s of wall time and 366 s of CPU on the
shared 2 cores at a load average of 8-10; 81 MiB.

Binaries land in ``${AGENTFLOWS_BIN_CACHE:-/var/cache/agentflows/bin}/<component>-<version>/``;
a second run finds them there and returns at once. ``AGENTFLOWS_CONTROL_PLANE_BIN`` names a
directory holding all three binaries and skips building altogether.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

KUBERNETES_VERSION = "v1.34.4"
ETCD_VERSION = "v3.6.16"
HELM_VERSION = "v3.22.0"
PROMETHEUS_MODULE_VERSION = "v0.316.0"
PROMETHEUS_COMMANDS = ("prometheus", "promtool")
JAEGER_VERSION = "v1.76.0"
# crictl, which the real node's ``down`` tears pod sandboxes down with (Debian 12 has no package).
CRICTL_VERSION = "v1.34.0"
# What a wrapper needs of Jaeger's go.mod: its ``go`` line and its one ``replace`` line (which is
# why a plain ``go install ...@version`` refuses it, as it does etcd).
JAEGER_GO = "1.24.6"
JAEGER_REPLACES = {"github.com/Shopify/sarama": "v1.33.0"}
# The Kubernetes version helm assumes without a cluster (``helm template``, ``helm lint``): helm's
# own release build derives it from its k8s.io/client-go requirement (v0.37 -> 1.37).
HELM_KUBE_VERSION = ("1", "37")

KUBERNETES_COMMANDS = ("kube-apiserver", "kube-controller-manager")
# The real node's binaries (``hack/control-plane up --node real``), built from the same module and
# into the same cache directory as the control plane's, so their versions can never disagree.
NODE_COMMANDS = ("kubelet", "kube-proxy", "kube-scheduler")
BINARY_NAMES = ("etcd", *KUBERNETES_COMMANDS)

_STAGING_REPLACE = re.compile(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/src/k8s\.io/[\w.-]+\s*$")


@dataclass(frozen=True)
class Binaries:
    """Paths of the three control-plane executables."""

    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path


def cache_root() -> Path:
    """Return the directory that holds the cached ``<component>-<version>/`` builds."""
    return Path(os.environ.get("AGENTFLOWS_BIN_CACHE", "/var/cache/agentflows/bin"))


def _log(message: str) -> None:
    print(f"[build] {message}", file=sys.stderr, flush=True)


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env["CGO_ENABLED"] = "0"
    env["GOFLAGS"] = "-mod=mod"
    env.setdefault("GOWORK", "off")
    return env


def run_go(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run one go command in ``cwd``; raise with its output when it fails."""
    completed = subprocess.run(
        ["go", *args], cwd=cwd, env=env or _go_env(), capture_output=True, text=True, check=False
    )
    if completed.returncode != 0:
        raise RuntimeError(
            f"go {' '.join(args)} failed (exit {completed.returncode}):\n"
            f"{completed.stdout}{completed.stderr}"
        )
    return completed.stdout


def staging_modules(kubernetes_version: str, workdir: Path) -> list[str]:
    """Read the staging module names from the published go.mod of ``k8s.io/kubernetes``."""
    info = json.loads(
        run_go(["mod", "download", "-json", f"k8s.io/kubernetes@{kubernetes_version}"], workdir)
    )
    modules = [
        match.group(1)
        for line in Path(info["GoMod"]).read_text().splitlines()
        if (match := _STAGING_REPLACE.match(line))
    ]
    if not modules:
        raise RuntimeError(
            f"no ./staging replace lines in go.mod of kubernetes {kubernetes_version}"
        )
    return modules


def _staging_version(kubernetes_version: str) -> str:
    # Staging modules are tagged v0.<minor>.<patch> for kubernetes v1.<minor>.<patch>.
    return "v0." + kubernetes_version.removeprefix("v1.")


def _kubernetes_ldflags(kubernetes_version: str) -> str:
    major, minor = kubernetes_version.removeprefix("v").split(".")[:2]
    build_date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    values = {
        "gitVersion": kubernetes_version,
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
        "buildDate": build_date,
    }
    flags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {package}.{name}={value}" for name, value in values.items()]
    return " ".join(flags)


def _write_wrapper(
    workdir: Path, requires: dict[str, str], replaces: dict[str, str], go: str = "1.24.0"
) -> None:
    lines = ["module agentflows.invalid/cpbuild", "", f"go {go}", "", "require ("]
    lines += [f"\t{module} {version}" for module, version in requires.items()]
    lines += [")", ""]
    if replaces:
        lines += ["replace ("]
        lines += [f"\t{module} => {module} {version}" for module, version in replaces.items()]
        lines += [")", ""]
    (workdir / "go.mod").write_text("\n".join(lines))


def _install(built: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(target.name + ".partial")
    shutil.copy2(built, staging)
    staging.chmod(0o755)
    staging.replace(target)


def build_kubernetes(
    version: str = KUBERNETES_VERSION, commands: tuple[str, ...] = KUBERNETES_COMMANDS
) -> Path:
    """Build the Kubernetes ``commands`` (default: the control plane's) ``version``.

    Return their directory, ``<cache>/kubernetes-<version>/``; commands already there are kept.
    """
    outdir = cache_root() / f"kubernetes-{version}"
    if all((outdir / name).is_file() for name in commands):
        return outdir
    with tempfile.TemporaryDirectory(prefix="agentflows-k8s-build-") as tmp:
        workdir = Path(tmp)
        staging_version = _staging_version(version)
        replaces = {module: staging_version for module in staging_modules(version, workdir)}
        _write_wrapper(workdir, {"k8s.io/kubernetes": version}, replaces)
        ldflags = _kubernetes_ldflags(version)
        for name in commands:
            if (outdir / name).is_file():
                continue
            started = time.monotonic()
            _log(f"building {name} {version} (staging modules at {staging_version})")
            out = workdir / name
            run_go(
                [
                    "build",
                    "-p",
                    "2",
                    "-trimpath",
                    "-ldflags",
                    ldflags,
                    "-o",
                    str(out),
                    f"k8s.io/kubernetes/cmd/{name}",
                ],
                workdir,
            )
            _install(out, outdir / name)
            size_mib = (outdir / name).stat().st_size / 2**20
            _log(f"built {name} in {time.monotonic() - started:.0f}s ({size_mib:.1f} MiB)")
    return outdir


def build_etcd(version: str = ETCD_VERSION) -> Path:
    """Build the etcd server ``version``; return its directory."""
    outdir = cache_root() / f"etcd-{version}"
    if (outdir / "etcd").is_file():
        return outdir
    with tempfile.TemporaryDirectory(prefix="agentflows-etcd-build-") as tmp:
        workdir = Path(tmp)
        _write_wrapper(workdir, {"go.etcd.io/etcd/server/v3": version}, {})
        started = time.monotonic()
        _log(f"building etcd {version}")
        out = workdir / "etcd"
        run_go(
            [
                "build",
                "-p",
                "2",
                "-trimpath",
                "-ldflags",
                "-s -w",
                "-o",
                str(out),
                "go.etcd.io/etcd/server/v3",
            ],
            workdir,
        )
        _install(out, outdir / "etcd")
        size_mib = (outdir / "etcd").stat().st_size / 2**20
        _log(f"built etcd in {time.monotonic() - started:.0f}s ({size_mib:.1f} MiB)")
    return outdir


def _helm_ldflags(version: str) -> str:
    major, minor = HELM_KUBE_VERSION
    flags = ["-s", "-w", f"-X helm.sh/helm/v3/internal/version.version={version}"]
    for package in ("helm.sh/helm/v3/pkg/chartutil", "helm.sh/helm/v3/pkg/lint/rules"):
        flags += [f"-X {package}.k8sVersionMajor={major}", f"-X {package}.k8sVersionMinor={minor}"]
    return " ".join(flags)


def _go_install(what: str, outdir: Path, packages: list[str], flags: list[str]) -> list[Path]:
    """``go install`` ``packages`` (``module/cmd/name@version``) into ``outdir``; return them.

    For modules whose ``go.mod`` has no ``replace`` lines (a plain ``go install`` takes them):
    helm, prometheus and promtool, crictl. The others need a wrapper (:func:`_write_wrapper`).
    """
    names = [package.split("@")[0].rsplit("/", 1)[-1] for package in packages]
    targets = [outdir / name for name in names]
    if all(target.is_file() for target in targets):
        return targets
    with tempfile.TemporaryDirectory(prefix=f"agentflows-{names[0]}-build-") as tmp:
        workdir = Path(tmp)
        env = {**_go_env(), "GOBIN": str(workdir / "bin"), "GOFLAGS": ""}
        started = time.monotonic()
        _log(f"building {what}")
        run_go(["install", "-p", "2", "-trimpath", *flags, *packages], workdir, env)
        for name, target in zip(names, targets, strict=True):
            _install(workdir / "bin" / name, target)
        size_mib = sum(target.stat().st_size for target in targets) / 2**20
        _log(f"built {what} in {time.monotonic() - started:.0f}s ({size_mib:.1f} MiB)")
    return targets


def helm_binary(version: str = HELM_VERSION) -> Path:
    """Return the cached ``helm`` ``version``, building it from the module proxy if needed."""
    [helm] = _go_install(
        f"helm {version}",
        cache_root() / f"helm-{version}",
        [f"helm.sh/helm/v3/cmd/helm@{version}"],
        ["-ldflags", _helm_ldflags(version)],
    )
    return helm


def _prometheus_ldflags(module_version: str) -> str:
    # Module v0.316.0 is Prometheus 3.16.0; `prometheus --version` prints the latter.
    minor, patch = module_version.removeprefix("v0.").split(".")
    release = f"{minor[0]}.{int(minor[1:])}.{patch}"
    package = "github.com/prometheus/common/version"
    return f"-s -w -X {package}.Version={release} -X {package}.Branch=module-{module_version}"


def prometheus_binaries(version: str = PROMETHEUS_MODULE_VERSION) -> tuple[Path, Path]:
    """Return the cached ``prometheus`` and ``promtool``, building them from the module proxy."""
    prometheus, promtool = _go_install(
        f"prometheus and promtool {version}",
        cache_root() / f"prometheus-{version}",
        [f"github.com/prometheus/prometheus/cmd/{name}@{version}" for name in PROMETHEUS_COMMANDS],
        ["-tags", "netgo,remove_all_sd", "-ldflags", _prometheus_ldflags(version)],
    )
    return prometheus, promtool


def jaeger_binary(version: str = JAEGER_VERSION) -> Path:
    """Return the cached ``jaeger`` (v2, ``cmd/jaeger``), building it from the module proxy."""
    target = cache_root() / f"jaeger-{version}" / "jaeger"
    if target.is_file():
        return target
    with tempfile.TemporaryDirectory(prefix="agentflows-jaeger-build-") as tmp:
        workdir = Path(tmp)
        _write_wrapper(
            workdir, {"github.com/jaegertracing/jaeger": version}, JAEGER_REPLACES, go=JAEGER_GO
        )
        started = time.monotonic()
        _log(f"building jaeger {version}")
        out = workdir / "jaeger"
        package = "github.com/jaegertracing/jaeger"
        ldflags = f"-s -w -X {package}/internal/version.latestVersion={version}"
        run_go(
            [
                "build",
                "-p",
                "2",
                "-trimpath",
                "-ldflags",
                ldflags,
                "-o",
                str(out),
                f"{package}/cmd/jaeger",
            ],
            workdir,
        )
        _install(out, target)
        size_mib = target.stat().st_size / 2**20
        _log(f"built jaeger in {time.monotonic() - started:.0f}s ({size_mib:.1f} MiB)")
    return target


def crictl_binary(version: str = CRICTL_VERSION) -> Path:
    """Return the cached ``crictl`` ``version``, building it from the module proxy if needed."""
    [crictl] = _go_install(
        f"crictl {version}",
        cache_root() / f"crictl-{version}",
        [f"sigs.k8s.io/cri-tools/cmd/crictl@{version}"],
        ["-ldflags", "-s -w"],
    )
    return crictl


def crictl_binary_if_built(version: str = CRICTL_VERSION) -> Path | None:
    """Return the cached ``crictl`` if it is there (``down`` never builds anything)."""
    target = cache_root() / f"crictl-{version}" / "crictl"
    return target if target.is_file() else None


def ensure_node_binaries() -> Path:
    """Build or find the real node's binaries (kubelet, kube-proxy, kube-scheduler, crictl)."""
    crictl_binary()
    return build_kubernetes(commands=NODE_COMMANDS)


def ensure_binaries() -> Binaries:
    """Return the binaries from AGENTFLOWS_CONTROL_PLANE_BIN or the cache, building if needed."""
    override = os.environ.get("AGENTFLOWS_CONTROL_PLANE_BIN")
    if override:
        directory = Path(override)
        missing = [name for name in BINARY_NAMES if not (directory / name).is_file()]
        if missing:
            raise FileNotFoundError(
                f"AGENTFLOWS_CONTROL_PLANE_BIN={override} lacks {', '.join(missing)}"
            )
        return Binaries(
            directory / "etcd", directory / "kube-apiserver", directory / "kube-controller-manager"
        )
    etcd_dir = build_etcd()
    kubernetes_dir = build_kubernetes()
    return Binaries(
        etcd_dir / "etcd",
        kubernetes_dir / "kube-apiserver",
        kubernetes_dir / "kube-controller-manager",
    )

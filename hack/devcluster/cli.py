"""The ``hack/control-plane`` command line: build, up, down, status, env.

``build`` makes sure the pinned binaries are cached (instant when they are), ``build-helm`` the
same for helm (which the chart tests use), ``build-prometheus`` for prometheus and promtool
(which the monitoring tests use), ``build-jaeger`` for jaeger (which the tracing tests use);
``build-image`` builds ``agentflows:<appVersion>`` from the ``Dockerfile``
(:mod:`devcluster.appimage`), which ``up --node real`` imports into the node;
``write-monitoring`` renders the chart's PodMonitors and
PrometheusRule into ``config/prometheus`` for kustomize users; ``up`` starts a control plane
(``--audit-log``: with the API server's audit log) in ``$AGENTFLOWS_CP_DIR`` (default
``/tmp/agentflows-cp``) and waits until it is ready; ``down`` stops it and removes the
directory; ``status`` reports on it; ``env`` prints the ``export KUBECONFIG=...`` line for
``eval``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from devcluster import appimage, build, controlplane, monitoring, node


def _state_dir(args: argparse.Namespace) -> Path:
    return Path(args.state_dir) if args.state_dir else controlplane.DEFAULT_STATE_DIR


def _build(_: argparse.Namespace) -> int:
    started = time.monotonic()
    binaries = build.ensure_binaries()
    for path in (binaries.etcd, binaries.kube_apiserver, binaries.kube_controller_manager):
        print(f"{path}  {path.stat().st_size / 2**20:.1f} MiB")
    print(f"binaries ready in {time.monotonic() - started:.1f}s", file=sys.stderr)
    return 0


def _build_node(_: argparse.Namespace) -> int:
    started = time.monotonic()
    directory = build.ensure_node_binaries()
    for path in [*(directory / name for name in build.NODE_COMMANDS), build.crictl_binary()]:
        print(f"{path}  {path.stat().st_size / 2**20:.1f} MiB")
    print(f"node binaries ready in {time.monotonic() - started:.1f}s", file=sys.stderr)
    return 0


def _build_helm(_: argparse.Namespace) -> int:
    started = time.monotonic()
    path = build.helm_binary()
    print(f"{path}  {path.stat().st_size / 2**20:.1f} MiB")
    print(f"helm ready in {time.monotonic() - started:.1f}s", file=sys.stderr)
    return 0


def _build_prometheus(_: argparse.Namespace) -> int:
    started = time.monotonic()
    for path in build.prometheus_binaries():
        print(f"{path}  {path.stat().st_size / 2**20:.1f} MiB")
    print(f"prometheus ready in {time.monotonic() - started:.1f}s", file=sys.stderr)
    return 0


def _build_jaeger(_: argparse.Namespace) -> int:
    started = time.monotonic()
    path = build.jaeger_binary()
    print(f"{path}  {path.stat().st_size / 2**20:.1f} MiB")
    print(f"jaeger ready in {time.monotonic() - started:.1f}s", file=sys.stderr)
    return 0


def _build_image(_: argparse.Namespace) -> int:
    built = appimage.app_image()
    print(f"{built.tag}  {built.archive}  {built.size_bytes / 2**20:.0f} MiB")
    print(f"image ready in {built.seconds:.1f}s", file=sys.stderr)
    return 0


def _write_monitoring(_: argparse.Namespace) -> int:
    for path in monitoring.write(build.helm_binary()):
        print(path)
    return 0


def _up(args: argparse.Namespace) -> int:
    started = time.monotonic()
    cp = controlplane.start(_state_dir(args), audit=args.audit_log, node_kind=args.node)
    if args.node == "real":
        built = appimage.load_into_node(cp.state_dir)
        print(f"  image {built.tag} imported (pods name it with imagePullPolicy: Never)")
    elapsed = time.monotonic() - started
    print(
        f"control plane ready in {elapsed:.1f}s at {cp.server} "
        f"(kubernetes {cp.versions['kubernetes']}, etcd {cp.versions['etcd']}, "
        f"{cp.node} node)"
    )
    print(f"  export KUBECONFIG={cp.kubeconfig('admin')}")
    users = ", ".join(f"{cp.kubeconfig(u)}" for u in controlplane.USERS if u != "admin")
    print(f"  other users' kubeconfigs: {users}")
    print(f"  logs: {cp.state_dir / 'logs'}  pods: {cp.pods_dir()}")
    print("  stop with: hack/control-plane down")
    return 0


def _down(args: argparse.Namespace) -> int:
    controlplane.stop(_state_dir(args))
    print(f"control plane in {_state_dir(args)} stopped")
    return 0


def _status(args: argparse.Namespace) -> int:
    report = controlplane.status(_state_dir(args))
    print(json.dumps(report, indent=2))
    return 0 if report["running"] else 1


def _env(args: argparse.Namespace) -> int:
    cp = controlplane.ControlPlane.load(_state_dir(args))
    print(f"export KUBECONFIG={cp.kubeconfig(args.user)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run one subcommand; return the exit status."""
    parser = argparse.ArgumentParser(prog="hack/control-plane", description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", help="default: $AGENTFLOWS_CP_DIR or /tmp/agentflows-cp")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="build or find the cached binaries").set_defaults(run=_build)
    commands.add_parser(
        "build-node", help="build or find kubelet, kube-proxy, kube-scheduler and crictl"
    ).set_defaults(run=_build_node)
    commands.add_parser("build-helm", help="build or find the cached helm").set_defaults(
        run=_build_helm
    )
    commands.add_parser(
        "build-prometheus", help="build or find the cached prometheus and promtool"
    ).set_defaults(run=_build_prometheus)
    commands.add_parser(
        "build-jaeger", help="build or find the cached jaeger (the tracing tests' backend)"
    ).set_defaults(run=_build_jaeger)
    commands.add_parser(
        "build-image",
        help="build agentflows:<appVersion> from the Dockerfile (a local Debian + Python base)",
    ).set_defaults(run=_build_image)
    commands.add_parser(
        "write-monitoring", help="render the chart's monitoring objects into config/prometheus"
    ).set_defaults(run=_write_monitoring)
    up = commands.add_parser("up", help="start and wait until ready")
    up.add_argument(
        "--audit-log",
        action="store_true",
        help="API server audit log in <state>/logs/audit.log (bench/operator_scale.py reads it)",
    )
    up.add_argument(
        "--node",
        choices=controlplane.NODE_KINDS,
        default="real",
        help="real (default): containerd, kubelet, kube-proxy and kube-scheduler (root; "
        "hack/install-node installs what it needs); process: the process kubelet, for a machine "
        "without a container runtime",
    )
    up.set_defaults(run=_up)
    commands.add_parser("down", help="stop everything, remove the state").set_defaults(run=_down)
    commands.add_parser("status", help="report processes and readiness").set_defaults(run=_status)
    env = commands.add_parser("env", help="print export KUBECONFIG=...")
    env.add_argument("--user", default="admin", choices=sorted(controlplane.USERS))
    env.set_defaults(run=_env)
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except (controlplane.ControlPlaneError, node.NodeError, RuntimeError, OSError) as error:
        print(f"hack/control-plane {args.command}: {error}", file=sys.stderr)
        return 1

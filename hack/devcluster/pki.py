"""Certificates and keys for the development control plane, made with the ``openssl`` command.

Called by :mod:`devcluster.controlplane` once per start: a throwaway CA, the kube-apiserver's
serving certificate (valid for 127.0.0.1, localhost and the in-cluster ``kubernetes`` names), the
process kubelet's serving certificate (for ``kubectl logs``), and the RSA key pair that signs and
verifies service-account tokens. The ``openssl`` CLI is used rather than a Python package so that
the dev cluster adds no dependency.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

_DAYS = "3650"


@dataclass(frozen=True)
class Pki:
    """Paths of every file that :func:`generate` writes."""

    ca_cert: Path
    ca_key: Path
    apiserver_cert: Path
    apiserver_key: Path
    kubelet_cert: Path
    kubelet_key: Path
    service_account_key: Path
    service_account_pub: Path


def _openssl(*args: str) -> None:
    completed = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {completed.stderr.strip()}")


def _ec_key(path: Path) -> None:
    _openssl(
        "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path)
    )
    path.chmod(0o600)


def _signed_cert(
    directory: Path, name: str, ca: tuple[Path, Path], subject: str, alt_names: list[str]
) -> tuple[Path, Path]:
    key = directory / f"{name}.key"
    cert = directory / f"{name}.crt"
    _ec_key(key)
    _openssl(
        "req",
        "-new",
        "-x509",
        "-key",
        str(key),
        "-out",
        str(cert),
        "-days",
        _DAYS,
        "-subj",
        subject,
        "-CA",
        str(ca[0]),
        "-CAkey",
        str(ca[1]),
        "-addext",
        "subjectAltName=" + ",".join(alt_names),
        "-addext",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        "-addext",
        "extendedKeyUsage=serverAuth,clientAuth",
        "-addext",
        "basicConstraints=critical,CA:FALSE",
    )
    return cert, key


def generate(directory: Path, service_ip: str, node_ip: str | None = None) -> Pki:
    """Write a fresh CA, serving certificates and service-account keys into ``directory``.

    With ``node_ip`` (a real node's bridge address, where the API server and kubelet listen) the
    serving certificates hold that address too, and ``kubelet-client.crt`` is the API server's
    client certificate for the kubelet (``system:masters``: logs, exec, attach, port-forward).
    """
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = directory / "ca.key"
    ca_cert = directory / "ca.crt"
    _ec_key(ca_key)
    _openssl(
        "req",
        "-new",
        "-x509",
        "-key",
        str(ca_key),
        "-out",
        str(ca_cert),
        "-days",
        _DAYS,
        "-subj",
        "/CN=agentflows-dev-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
    )
    ca = (ca_cert, ca_key)
    local_names = ["IP:127.0.0.1", "DNS:localhost", *([f"IP:{node_ip}"] if node_ip else [])]
    apiserver_cert, apiserver_key = _signed_cert(
        directory,
        "apiserver",
        ca,
        "/CN=kube-apiserver",
        [
            *local_names,
            f"IP:{service_ip}",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local",
        ],
    )
    kubelet_cert, kubelet_key = _signed_cert(
        directory, "kubelet", ca, "/CN=agentflows-process-kubelet", local_names
    )
    if node_ip:
        _signed_cert(
            directory,
            "kubelet-client",
            ca,
            "/O=system:masters/CN=kube-apiserver-kubelet-client",
            ["DNS:kube-apiserver-kubelet-client"],
        )
    service_account_key = directory / "sa.key"
    service_account_pub = directory / "sa.pub"
    _openssl(
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:2048",
        "-out",
        str(service_account_key),
    )
    service_account_key.chmod(0o600)
    _openssl("pkey", "-in", str(service_account_key), "-pubout", "-out", str(service_account_pub))
    return Pki(
        ca_cert,
        ca_key,
        apiserver_cert,
        apiserver_key,
        kubelet_cert,
        kubelet_key,
        service_account_key,
        service_account_pub,
    )

"""Credentials as kubectl reads them (:mod:`agentflows.kube.kubeconfig`), against loopback servers.

The API server is the loopback echo service (``/echo`` answers the request's headers) or, for
client certificates, a loopback TLS server that requires one. Exec plugins are small Python
scripts printing an ExecCredential, as EKS, GKE and AKS helpers do.
"""

from __future__ import annotations

import asyncio
import base64
import http.server
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentflows.kube import client as kube
from agentflows.kube import kubeconfig
from tests.support.endpoint import LoopbackEndpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack"))
from devcluster import pki

PLUGIN = """#!{python}
import json, os, pathlib, sys
counter = pathlib.Path({counter!r})
runs = int(counter.read_text()) + 1 if counter.exists() else 1
counter.write_text(str(runs))
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
if {fail!r}:
    print("token service is down", file=sys.stderr)
    sys.exit(3)
status = {{"token": f"{token}-{{runs}}"}}
if {expires!r}:
    status["expirationTimestamp"] = {expires!r}
print(json.dumps({{"apiVersion": info["apiVersion"], "kind": "ExecCredential", "status": status}}))
"""


@pytest.fixture
def echo() -> Iterator[LoopbackEndpoint]:
    endpoint = LoopbackEndpoint().start()
    yield endpoint
    endpoint.stop()


@pytest.fixture(autouse=True)
def no_ambient_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No $KUBECONFIG, ~/.kube/config or in-cluster environment from the machine."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def plugin(
    directory: Path, token: str, *, fail: bool = False, expires: str | None = None
) -> tuple[Path, Path]:
    """An exec plugin script and the file counting its runs."""
    script = directory / f"plugin-{token}"
    counter = directory / f"runs-{token}"
    script.write_text(
        PLUGIN.format(
            python=sys.executable, counter=str(counter), fail=fail, expires=expires, token=token
        )
    )
    script.chmod(0o755)
    return script, counter


def write_config(
    path: Path,
    contexts: dict[str, tuple[str, dict[str, Any]]],
    servers: dict[str, dict[str, Any]],
    current: str | None = None,
) -> Path:
    """A kubeconfig: context name -> (cluster name, user entry); cluster name -> cluster entry."""
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": n, "cluster": c} for n, c in servers.items()],
        "users": [{"name": f"{n}-user", "user": u} for n, (_, u) in contexts.items()],
        "contexts": [
            {"name": n, "context": {"cluster": c, "user": f"{n}-user", "namespace": f"ns-{n}"}}
            for n, (c, _) in contexts.items()
        ],
    }
    if current:
        doc["current-context"] = current
    path.write_text(yaml.safe_dump(doc))
    return path


def exec_user(script: Path, api_version: str = "client.authentication.k8s.io/v1") -> dict[str, Any]:
    return {"exec": {"apiVersion": api_version, "command": str(script), "interactiveMode": "Never"}}


def headers_seen(config: kubeconfig.Config, times: int = 1) -> list[dict[str, str]]:
    """The headers of ``times`` GET /echo requests made with ``config``."""

    async def go() -> list[dict[str, str]]:
        async with kube.Client(config, retry_seconds=0) as api:
            return [(await api.get("/echo"))["headers"] for _ in range(times)]

    return asyncio.run(go())


@pytest.mark.parametrize(
    "api_version", ["client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1"]
)
def test_an_exec_plugins_token_is_sent_as_the_bearer_token(
    tmp_path: Path, echo: LoopbackEndpoint, api_version: str
) -> None:
    script, _ = plugin(tmp_path, "eks")
    path = write_config(
        tmp_path / "config",
        {"prod": ("c", exec_user(script, api_version))},
        {"c": {"server": echo.url}},
        current="prod",
    )
    config = kubeconfig.load(str(path))
    assert config.namespace == "ns-prod"
    assert headers_seen(config)[0]["authorization"] == "Bearer eks-1"


def test_an_expired_exec_credential_is_renewed_before_the_next_request(
    tmp_path: Path, echo: LoopbackEndpoint
) -> None:
    script, counter = plugin(tmp_path, "gke", expires="2001-01-01T00:00:00Z")
    path = write_config(
        tmp_path / "config", {"p": ("c", exec_user(script))}, {"c": {"server": echo.url}}, "p"
    )
    seen = headers_seen(kubeconfig.load(str(path)), times=2)
    assert [h["authorization"] for h in seen] == ["Bearer gke-2", "Bearer gke-3"]
    assert counter.read_text() == "3"


def test_a_failing_exec_plugin_is_an_error_with_its_message(tmp_path: Path) -> None:
    script, _ = plugin(tmp_path, "aks", fail=True)
    path = write_config(
        tmp_path / "config",
        {"p": ("c", exec_user(script))},
        {"c": {"server": "https://127.0.0.1:1"}},
        "p",
    )
    with pytest.raises(kubeconfig.ConfigError) as error:
        kubeconfig.load(str(path))
    assert str(error.value) == (
        f"exec plugin {script}: exec: process returned 3. token service is down"
    )


def test_an_exec_credential_expiry_that_is_not_a_time_is_an_error_naming_the_field(
    tmp_path: Path,
) -> None:
    script, _ = plugin(tmp_path, "odd", expires="next tuesday")
    path = write_config(
        tmp_path / "config",
        {"p": ("c", exec_user(script))},
        {"c": {"server": "https://127.0.0.1:1"}},
        "p",
    )
    with pytest.raises(kubeconfig.ConfigError) as error:
        kubeconfig.load(str(path))
    assert str(error.value) == (
        f"exec plugin {script}: status.expirationTimestamp 'next tuesday' is not an RFC 3339 "
        "time (e.g. 2026-01-02T03:04:05Z)"
    )


def test_context_picks_the_cluster_user_and_namespace(
    tmp_path: Path, echo: LoopbackEndpoint
) -> None:
    path = write_config(
        tmp_path / "config",
        {
            "staging": ("nowhere", {"token": "staging-token"}),
            "prod": ("echo", {"token": "prod-token"}),
        },
        {"nowhere": {"server": "https://127.0.0.1:1"}, "echo": {"server": echo.url}},
        current="staging",
    )
    assert kubeconfig.load(str(path)).server == "https://127.0.0.1:1"
    chosen = kubeconfig.load(str(path), "prod")
    assert (chosen.server, chosen.namespace) == (echo.url, "ns-prod")
    assert headers_seen(chosen)[0]["authorization"] == "Bearer prod-token"


def test_a_context_not_in_the_kubeconfig_is_named_with_the_ones_there(tmp_path: Path) -> None:
    path = write_config(
        tmp_path / "config",
        {"a": ("c", {"token": "x"}), "b": ("c", {"token": "y"})},
        {"c": {"server": "https://127.0.0.1:1"}},
        current="a",
    )
    with pytest.raises(kubeconfig.ConfigError) as error:
        kubeconfig.load(str(path), "x")
    assert str(error.value) == 'context "x" not in kubeconfig (have: a, b)'


def test_every_kubeconfig_path_is_merged_and_the_first_current_context_wins(
    tmp_path: Path, echo: LoopbackEndpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = write_config(
        tmp_path / "first", {"one": ("c", {"token": "first"})}, {"c": {"server": echo.url}}, "one"
    )
    second = write_config(
        tmp_path / "second",
        {"two": ("c", {"token": "second"}), "one": ("c", {"token": "shadowed"})},
        {"c": {"server": "https://127.0.0.1:1"}},
        "two",
    )
    monkeypatch.setenv("KUBECONFIG", f"{first}{os.pathsep}{tmp_path / 'missing'}:{second}")
    config = kubeconfig.load()
    assert (config.server, headers_seen(config)[0]["authorization"]) == (echo.url, "Bearer first")
    assert headers_seen(kubeconfig.load(None, "two"))[0]["authorization"] == "Bearer second"


def test_no_kubeconfig_anywhere_says_how_to_give_one(tmp_path: Path) -> None:
    with pytest.raises(kubeconfig.ConfigError) as error:
        kubeconfig.load()
    assert str(error.value) == "no kubeconfig: set KUBECONFIG or --kubeconfig"
    with pytest.raises(kubeconfig.ConfigError) as missing:
        kubeconfig.load(str(tmp_path / "nope"))
    assert str(missing.value) == f"kubeconfig {tmp_path / 'nope'}: no such file"


def test_an_unreachable_server_is_named_with_the_reason(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = write_config(
        tmp_path / "config",
        {"p": ("c", {"token": "x"})},
        {"c": {"server": f"https://127.0.0.1:{port}", "insecure-skip-tls-verify": True}},
        "p",
    )

    async def go() -> None:
        async with kube.Client(kubeconfig.load(str(path)), retry_seconds=0) as api:
            await api.get("/api")

    with pytest.raises(kube.ApiError) as error:
        asyncio.run(go())
    assert str(error.value) == f"cannot reach https://127.0.0.1:{port}: connection refused"


class _PeerHandler(http.server.BaseHTTPRequestHandler):
    """Answers with the subject of the client certificate it was shown."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        peer = self.connection.getpeercert()  # type: ignore[attr-defined]
        subject = dict(item for rdn in peer["subject"] for item in rdn)
        body = json.dumps({"client": subject["commonName"]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_certificates_given_as_data_authenticate_and_leave_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = pki.generate(tmp_path / "pki", "10.0.0.1")
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(keys.ca_cert))
    server_tls.verify_mode = ssl.CERT_REQUIRED
    server_tls.load_cert_chain(str(keys.apiserver_cert), str(keys.apiserver_key))
    httpd = http.server.HTTPServer(("127.0.0.1", 0), _PeerHandler)
    httpd.socket = server_tls.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()

    def data(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    user = {
        "client-certificate-data": data(keys.kubelet_cert),
        "client-key-data": data(keys.kubelet_key),
    }
    cluster = {
        "server": f"https://127.0.0.1:{httpd.server_address[1]}",
        "certificate-authority-data": data(keys.ca_cert),
    }
    path = write_config(tmp_path / "config", {"p": ("c", user)}, {"c": cluster}, "p")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))

    async def go() -> Any:
        async with kube.Client(kubeconfig.load(str(path)), retry_seconds=0) as api:
            return await api.get("/whoami")

    try:
        assert asyncio.run(go()) == {"client": "agentflows-process-kubelet"}
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert sorted(scratch.iterdir()) == []


def test_the_cli_names_an_unknown_context_and_exits_2(tmp_path: Path) -> None:
    path = write_config(
        tmp_path / "config",
        {"dev": ("c", {"token": "x"}), "prod": ("c", {"token": "y"})},
        {"c": {"server": "https://127.0.0.1:1"}},
        current="dev",
    )
    done = subprocess.run(
        [
            *(sys.executable, "-m", "agentflows.cli.main", "get", "r1"),
            *("--kubeconfig", str(path), "--context", "stage"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stderr) == (
        2,
        'error: context "stage" not in kubeconfig (have: dev, prod)\n',
    )


@pytest.mark.parametrize(
    "command",
    [
        ("operator", "--metrics-port", "0"),
        ("trigger", "--flow", "team-a/nightly", "--trigger", "daily"),
        ("webhook", "--port", "0"),
        ("watch", "r1"),
        ("approve", "r1"),
    ],
)
def test_every_cluster_command_takes_context_and_says_what_is_wrong(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    path = write_config(
        tmp_path / "config",
        {"dev": ("c", {"token": "x"})},
        {"c": {"server": "https://127.0.0.1:1"}},
        current="dev",
    )
    done = subprocess.run(
        [
            *(sys.executable, "-m", "agentflows.cli.main", *command),
            *("--kubeconfig", str(path), "--context", "prod"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.endswith('error: context "prod" not in kubeconfig (have: dev)\n')


def test_in_a_pod_without_kubeconfig_the_service_account_is_used_and_its_token_reread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("first\n")
    (account / "ca.crt").write_text("a CA\n")
    (account / "namespace").write_text("team-a")
    monkeypatch.setattr(kubeconfig, "SERVICE_ACCOUNT_DIR", account)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    config = kubeconfig.load()
    assert (config.server, config.namespace, config.ca_file) == (
        "https://10.96.0.1:443",
        "team-a",
        str(account / "ca.crt"),
    )
    assert config.authorization() == "Bearer first"
    (account / "token").write_text("rotated\n")
    assert config.authorization() == "Bearer rotated"
    with pytest.raises(kubeconfig.ConfigError) as error:
        kubeconfig.load(None, "prod")
    assert str(error.value) == "no kubeconfig: set KUBECONFIG or --kubeconfig"


def test_a_pods_kubeconfig_is_read_without_the_kubernetes_package(
    tmp_path: Path, echo: LoopbackEndpoint
) -> None:
    token = tmp_path / "token"
    token.write_text("pod-token-1\n")
    path = write_config(
        tmp_path / "config",
        {"pod": ("c", {"tokenFile": str(token)})},
        {"c": {"server": echo.url}},
        "pod",
    )
    code = (
        "import json, sys\n"
        "from agentflows.kube import kubeconfig\n"
        "config = kubeconfig.load(sys.argv[1])\n"
        "print(json.dumps([config.server, config.namespace, 'kubernetes' in sys.modules]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True
    )
    assert json.loads(done.stdout) == [echo.url, "ns-pod", False]
    config = kubeconfig.load(str(path))
    assert headers_seen(config)[0]["authorization"] == "Bearer pod-token-1"
    token.write_text("pod-token-2\n")  # projected tokens rotate: read per request
    assert headers_seen(config)[0]["authorization"] == "Bearer pod-token-2"

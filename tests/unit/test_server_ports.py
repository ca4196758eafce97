"""A server command whose port is taken says which port and which option, and exits 2 (issue 19).

Each command is run as a user runs it (a subprocess of the installed CLI) while this test holds
the port with a listening socket; nothing else may be listening there.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port this test listens on (all interfaces), so any bind of it fails."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        sock.listen(1)
        yield int(sock.getsockname()[1])


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    """Credentials for an API server nobody listens for: the servers bind before they call it."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def agentflows(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentflows.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        check=False,
    )


def test_operator_with_its_metrics_port_in_use_exits_2_naming_the_port_and_option(
    taken_port: int, kubeconfig: Path, tmp_path: Path
) -> None:
    done = agentflows(
        "operator", "--kubeconfig", str(kubeconfig), "--metrics-port", str(taken_port), cwd=tmp_path
    )
    assert done.returncode == 2, done.stderr
    assert f"error: port {taken_port} is in use (--metrics-port)" in done.stderr
    assert "a bug in agentflows" not in done.stderr


def test_webhook_receiver_with_its_port_in_use_exits_2_naming_the_port_and_option(
    taken_port: int, kubeconfig: Path, tmp_path: Path
) -> None:
    done = agentflows(
        "webhook", "--kubeconfig", str(kubeconfig), "--port", str(taken_port), cwd=tmp_path
    )
    assert done.returncode == 2, done.stderr
    assert f"error: port {taken_port} is in use (--port)" in done.stderr


def test_console_with_its_port_in_use_exits_2_naming_the_port_and_option(
    taken_port: int, tmp_path: Path
) -> None:
    done = agentflows(
        "console", "--local", "--state-dir", str(tmp_path), "--port", str(taken_port), cwd=tmp_path
    )
    assert done.returncode == 2, done.stderr
    assert f"error: port {taken_port} is in use (--port)" in done.stderr

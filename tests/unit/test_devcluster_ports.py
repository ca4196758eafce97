"""The ports the development cluster hands its components: free, and outside the kernel's range."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack"))
from devcluster import ports


def test_a_picked_port_is_below_the_ephemeral_range_and_free() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    picked = [ports.free_port() for _ in range(20)]
    assert len(set(picked)) == 20  # never handed out twice
    for port in picked:
        assert 1024 <= port < low
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # nothing holds it


def test_a_port_something_is_bound_to_is_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            other = probe.getsockname()[1]
        offered = iter([taken, other])
        monkeypatch.setattr(ports, "_ephemeral_low", lambda: max(taken, other) + 1)
        monkeypatch.setattr(ports.random, "choice", lambda _candidates: next(offered))
        assert ports.free_port() == other

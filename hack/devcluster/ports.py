"""Free TCP ports for servers that bind later: the control plane's components, a test's operator.

A port handed to a process as a flag is picked by binding it once and closing it, so something
else may take it before the process binds it. Picked the usual way (binding port 0), it lies in
the kernel's ephemeral range, which is also where every outgoing connection gets its local port,
and a control plane opens hundreds of those (the API server to etcd, the controllers to the API
server): once in a while one of them is given the very port picked for kube-controller-manager,
which then fails with ``bind: address already in use``. Below that range the kernel gives no
connection a port, so only another explicit bind can take one picked there.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: The kernel's ephemeral range: ``low high``.
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: How many ports below the ephemeral range are candidates.
_SPAN = 16384
#: Picked by this process already: never handed out twice.
_picked: set[int] = set()


def free_port() -> int:
    """A port no socket of this host is bound to, below the ephemeral range when there is room."""
    low = _ephemeral_low()
    candidates = range(max(1024, low - _SPAN), low)
    if len(candidates) < 1024:  # an unusual ephemeral range: any free port will do
        return _any_free_port()
    for _ in range(1000):
        port = random.choice(candidates)
        if port not in _picked and _bindable(port):
            _picked.add(port)
            return port
    raise OSError(f"no free port in {candidates.start}-{candidates.stop - 1}")


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(port: int) -> bool:
    """Whether ``port`` can be bound on every address (so on none is it bound already)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _any_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])

"""One way to serve HTTP from a test: a threaded server in a daemon thread, started and stopped.

The scripted model server, the A2A agent, the http tool's endpoint and the tool board (and a
test's own one-off servers) derive from :class:`ServedHTTP`; each brings its handler class.
"""

from __future__ import annotations

import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class QuietHTTPServer(ThreadingHTTPServer):
    """A threaded HTTP server that does not print clients hanging up (timeouts in tests)."""

    daemon_threads = True
    #: socketserver's default backlog of 5 resets connections of a ``map`` of fifty agents.
    request_queue_size = 128

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Ipv6Server(QuietHTTPServer):
    address_family = socket.AF_INET6


class ServedHTTP:
    """A server of ``handler`` on ``host`` (IPv4 or IPv6) and ``port`` (0: any free one).

    :meth:`start` serves in a daemon thread; :meth:`stop` shuts the server down, closes its
    socket and joins the thread. :attr:`origin` is ``http://host:port`` (IPv6 in brackets).
    """

    def __init__(
        self,
        handler: type[BaseHTTPRequestHandler],
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        name: str | None = None,
    ) -> None:
        server_class = _Ipv6Server if ":" in host else QuietHTTPServer
        self._httpd = server_class((host, port), handler)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=name or type(self).__name__,
            daemon=True,
        )

    @property
    def origin(self) -> str:
        """``http://host:port`` of the listening socket."""
        host, port = self._httpd.server_address[:2]
        return f"http://[{host!s}]:{port}" if ":" in str(host) else f"http://{host!s}:{port}"

    @property
    def port(self) -> int:
        """The port the server listens on."""
        return int(self._httpd.server_address[1])

    def start(self) -> Self:
        """Serve in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close the socket and wait for the serving thread."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

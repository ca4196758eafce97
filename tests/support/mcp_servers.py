"""Real MCP servers, built with the mcp SDK, for tests of the agents layer's MCP tools.

- :class:`HttpMcpServer`: the SDK's streamable-HTTP app served by uvicorn on loopback in a
  background thread; with ``token`` set it answers 401 unless ``Authorization: Bearer <token>``
  is sent (a header the Agent takes from a Secret).
- :func:`stdio_command`: the command line of the same server over stdio; this file is the
  script (``python tests/support/mcp_servers.py``), so it needs nothing but the mcp SDK.

Both offer the same tools: ``add(a, b)``, ``echo(text)``, ``sleep(seconds)`` (for timeouts),
``fail(message)`` (a tool error) and ``whoami()`` (which transport it is on).
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

#: The tools both servers offer, in order.
TOOL_NAMES = ["add", "echo", "sleep", "fail", "whoami"]


def build_server(transport: str) -> MCPServer:
    """The test server: a few small tools (see module docstring)."""
    server = MCPServer("agentflows-test", log_level="ERROR")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def echo(text: str) -> str:
        """Answer the text it is given."""
        return text

    @server.tool()
    async def sleep(seconds: float) -> str:
        """Wait, then answer."""
        await asyncio.sleep(seconds)
        return f"slept {seconds}"

    @server.tool()
    def fail(message: str) -> str:
        """Always fail with the message."""
        raise ValueError(message)

    @server.tool()
    def whoami() -> str:
        """Name the transport."""
        return transport

    return server


class _RequireBearer:
    """ASGI middleware: 401 unless the request carries the expected bearer token."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != (
            self.expected
        ):
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [(b"content-type", b"text/plain")],
                }
            )
            await send({"type": "http.response.body", "body": b"missing or wrong token"})
            return
        await self.app(scope, receive, send)


class HttpMcpServer:
    """The test server over streamable HTTP (or HTTP+SSE) on ``host`` (127.0.0.1 unless a
    runner pod must reach it: the node's bridge address), on a random port. The SDK's
    DNS-rebinding protection is on, allowing that host only."""

    def __init__(
        self, token: str | None = None, *, sse: bool = False, host: str = "127.0.0.1"
    ) -> None:
        import uvicorn
        from mcp.server.transport_security import TransportSecuritySettings

        server = build_server("sse" if sse else "http")
        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=[f"{host}:*"],
            allowed_origins=[f"http://{host}:*"],
        )
        app: Any = (
            server.sse_app(host=host, transport_security=security)
            if sse
            else server.streamable_http_app(host=host, transport_security=security)
        )
        self.host = host
        self._path = "/sse" if sse else "/mcp"
        if token is not None:
            app = _RequireBearer(app, token)
        self._socket = socket.socket()
        self._socket.bind((host, 0))
        self.port = self._socket.getsockname()[1]
        config = uvicorn.Config(app, log_level="error", lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )

    @property
    def url(self) -> str:
        """The MCP endpoint."""
        return f"http://{self.host}:{self.port}{self._path}"

    def start(self) -> HttpMcpServer:
        """Serve in a background thread; return once the server accepts requests."""
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the MCP test server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """Stop serving."""
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()


def stdio_command() -> tuple[str, list[str]]:
    """The command and arguments that start the test server over stdio."""
    return sys.executable, [str(Path(__file__).resolve())]


if __name__ == "__main__":
    build_server("stdio").run("stdio")

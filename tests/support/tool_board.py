"""Files that a test and the tools of its runs share over HTTP, wherever those tools run.

A python tool in a runner pod runs in a container: it cannot see the test's temporary
directory, and a restricted pod may not mount a host path. Tests that count a tool's calls,
journal its starts and ends, or hold it until they release it therefore share named files
through a :class:`ToolBoard`: a threaded stdlib HTTP server on an address the pods reach (the
node's bridge address on the real node, loopback for a process kubelet or a runner run as a
process).

``board / "name"`` is a :class:`BoardFile` whose ``str()`` is its URL, the value a tool's
``args`` carry, and which the test reads like a path (``exists``, ``read_text``, ``touch``).
The tool's side is :data:`CLIENT`, prepended to its script: ``append(url, text)`` (creates the
file), ``exists(url)`` and ``read(url)``. A file lives as long as the board: it survives the
pods that wrote it, which is what a durability test needs.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import unquote

from tests.support.http_serving import ServedHTTP

#: The tool's side, prepended to a python tool's script.
CLIENT = '''
import urllib.error as _board_error, urllib.request as _board_request

def append(url, text=""):
    """Append ``text`` to the board's file at ``url``, creating it."""
    request = _board_request.Request(url, data=text.encode(), method="POST")
    _board_request.urlopen(request, timeout=30).read()

def read(url):
    """The board's file at ``url``, or None when no one has written it."""
    try:
        return _board_request.urlopen(url, timeout=30).read().decode()
    except _board_error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise

def exists(url):
    return read(url) is not None
'''


class BoardFile:
    """One named file of a :class:`ToolBoard`, read by the test as it would read a path."""

    def __init__(self, board: ToolBoard, name: str) -> None:
        self.board = board
        self.name = name

    def __str__(self) -> str:
        return f"{self.board.url}/files/{self.name}"

    def __repr__(self) -> str:
        return f"BoardFile({str(self)!r})"

    def exists(self) -> bool:
        return self.board.read(self.name) is not None

    def read_text(self) -> str:
        text = self.board.read(self.name)
        if text is None:
            raise FileNotFoundError(str(self))
        return text

    def touch(self) -> None:
        self.board.append(self.name, "")


class ToolBoard(ServedHTTP):
    """The HTTP server holding the files; start it, share its files' URLs, stop it."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._files: dict[str, str] = {}
        self._lock = threading.Lock()
        super().__init__(self._handler_class(), host)

    @property
    def url(self) -> str:
        return self.origin

    def __truediv__(self, name: str) -> BoardFile:
        if not name or "/" in name:
            raise ValueError(f"a board file's name is one path segment, not {name!r}")
        return BoardFile(self, name)

    def read(self, name: str) -> str | None:
        with self._lock:
            return self._files.get(name)

    def append(self, name: str, text: str) -> None:
        with self._lock:
            self._files[name] = self._files.get(name, "") + text

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        board = self

        class Handler(BaseHTTPRequestHandler):
            def _name(self) -> str | None:
                prefix = "/files/"
                if not self.path.startswith(prefix):
                    self.send_error(404, "not a board file: the path is /files/<name>")
                    return None
                return unquote(self.path[len(prefix) :])

            def do_GET(self) -> None:
                name = self._name()
                if name is None:
                    return
                text = board.read(name)
                if text is None:
                    self.send_error(404, f"no file {name!r} on the board")
                    return
                self._answer(text.encode())

            def do_POST(self) -> None:
                name = self._name()
                if name is None:
                    return
                length = int(self.headers.get("Content-Length") or 0)
                board.append(name, self.rfile.read(length).decode())
                self._answer(b"")

            def _answer(self, body: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

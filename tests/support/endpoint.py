"""A loopback HTTP service for the http tool's tests: records requests, answers by path.

Used by the agents tests (``endpoint`` fixture in ``tests/unit/agents/conftest.py``) and the
attack suite (``tests/unit/security``). It listens on 127.0.0.1, or on ``::1`` when asked.
"""

from __future__ import annotations

import json
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.support.http_serving import ServedHTTP


class LoopbackEndpoint(ServedHTTP):
    """A tiny HTTP service the http tool calls: records requests, answers by path.

    - ``/weather/<city>`` answers JSON ``{"city": <city>, "forecast": "sunny"}``;
    - ``/echo`` answers JSON of the request (method, path, query, headers, body);
    - ``/text`` answers plain text; ``/big`` answers 200 kB; ``/fail`` answers 503;
      ``/status/<code>`` answers that status;
    - ``/slow`` answers after 2 s; ``/redirect?to=<url>`` redirects;
    - ``/form`` takes only ``application/x-www-form-urlencoded`` (415 otherwise) and answers the
      fields as JSON; ``/raw`` takes only ``text/plain`` and answers ``{"text": <body>}``.

    A recorded body is the parsed JSON, or the text when it is not JSON.
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.requests: list[dict[str, Any]] = []
        super().__init__(self._handler(), host)

    @property
    def url(self) -> str:
        """Base URL of the service (no trailing slash)."""
        return self.origin

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: bytes, content_type: str, **headers: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def _typed(self, path: str, raw: bytes) -> None:
                from urllib.parse import parse_qs

                wanted = "application/x-www-form-urlencoded" if path == "/form" else "text/plain"
                content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
                if content_type != wanted:
                    self._answer(415, f"expected {wanted}".encode(), "text/plain")
                    return
                text = raw.decode()
                data: Any = (
                    {k: v[0] for k, v in parse_qs(text).items()}
                    if path == "/form"
                    else {"text": text}
                )
                self._answer(200, json.dumps(data).encode(), "application/json")

            def _handle(self) -> None:
                from urllib.parse import parse_qs, urlsplit

                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                parts = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                record: dict[str, Any] = {
                    "method": self.command,
                    "path": parts.path,
                    "query": query,
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                    "body": _body(raw),
                }
                endpoint.requests.append(record)
                path = parts.path
                if path.startswith("/weather/"):
                    city = path.removeprefix("/weather/")
                    data = {"city": city, "forecast": "sunny"}
                    self._answer(200, json.dumps(data).encode(), "application/json")
                elif path == "/echo":
                    self._answer(200, json.dumps(record).encode(), "application/json")
                elif path == "/text":
                    self._answer(200, b"plain words", "text/plain")
                elif path == "/big":
                    self._answer(200, b"x" * 200_000, "text/plain")
                elif path == "/fail":
                    self._answer(503, b"backend down", "text/plain")
                elif path.startswith("/status/"):
                    code = int(path.removeprefix("/status/"))
                    self._answer(code, f"answered {code}".encode(), "text/plain")
                elif path == "/slow":
                    time.sleep(2)
                    self._answer(200, b"late", "text/plain")
                elif path in ("/form", "/raw"):
                    self._typed(path, raw)
                elif path == "/redirect":
                    self._answer(302, b"", "text/plain", Location=query["to"])
                else:
                    self._answer(404, b"no such path", "text/plain")

            do_GET = do_POST = do_PUT = _handle

        return Handler


def _body(raw: bytes) -> Any:
    """A request body as recorded: the parsed JSON, the text when it is not JSON, or None."""
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")

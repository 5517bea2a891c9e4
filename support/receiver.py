"""A loopback HTTP receiver for the benchmarks and drills (standard library only)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def serve(
    handle: Callable[[dict[str, str], bytes], int], *, port: int = 0, protocol: str = "HTTP/1.0"
) -> ThreadingHTTPServer:
    """A threaded HTTP server on 127.0.0.1:``port`` (0: a free port) that answers each POST with the
    status ``handle(headers, body)`` returns (headers lower-cased) and no body; it serves from a
    daemon thread until ``shutdown()``. HTTP/1.0 is a connection per request, so that a stopped
    server is really down (a kept-alive connection would go on being served by its thread)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = protocol

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(handle({k.lower(): v for k, v in self.headers.items()}, body))
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server

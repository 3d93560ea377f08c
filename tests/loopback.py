"""A test HTTP server on loopback, served from a thread for the length of a `with` block (fake API servers)."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def serving(server: http.server.HTTPServer) -> Iterator[str]:
    """Serve `server` (bound to 127.0.0.1) in a thread; yields its base URL; shut down and joined afterwards."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=120)


class JsonHandler(http.server.BaseHTTPRequestHandler):
    """A fake API server's handler: answers are JSON, and nothing is logged."""

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass

"""A real HTTP server that answers OpenAI-style streaming completions (one text chunk per asked token, then the
usage), or an error or a redirect, on a real socket: what the endpoint benchmark's client and its address checks
are tested against. It records what reached it (path and Host header of each request).

With ``slots``, it serves like an engine of fixed capacity: at most ``slots`` completions generate at once, each
token ``token_s`` seconds after the last; a request beyond them waits for a slot, so its time to first token grows
with the load, and the load an SLO allows is known (a closed loop of ``slots`` requests waits for none)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeEndpoint:
    """``reply``: "stream" (a served completion), "error" (``status`` with ``body``) or "redirect" (307 to
    ``location``)."""

    def __init__(self, host: str = "127.0.0.1", reply: str = "stream", status: int = 500, body: bytes = b"",
                 location: str = "", slots: int | None = None, token_s: float = 0.0):
        self.reply, self.status, self.body, self.location = reply, status, body, location
        self.slots = threading.BoundedSemaphore(slots) if slots else None
        self.token_s = token_s
        self.requests: list[dict] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                payload = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                endpoint.requests.append({"path": self.path, "host": self.headers.get("Host")})
                if endpoint.reply == "redirect":
                    self.send_response(307)
                    self.send_header("Location", endpoint.location)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif endpoint.reply == "error":
                    self.send_response(endpoint.status)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(endpoint.body)))
                    self.end_headers()
                    self.wfile.write(endpoint.body)
                elif endpoint.slots is not None:
                    with endpoint.slots:
                        self.stream(payload.get("max_tokens", 1))
                else:
                    self.stream(payload.get("max_tokens", 1))

            def stream(self, tokens: int):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()  # HTTP/1.0: the body ends when the connection closes
                for _ in range(tokens):
                    if endpoint.token_s:
                        time.sleep(endpoint.token_s)
                    self.wfile.write(b'data: {"choices": [{"text": "x"}]}\n\n')
                    self.wfile.flush()
                usage = {"choices": [], "usage": {"completion_tokens": tokens}}
                self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.host = host

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> FakeEndpoint:
        threading.Thread(target=self.server.serve_forever, name="fake-endpoint", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

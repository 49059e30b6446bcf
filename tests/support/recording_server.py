"""A small HTTP server that records every request (method, path, headers, body) and answers each
as its script says: the stand-in for an OTLP collector whose answers a test must choose (429 with
Retry-After, 503, a partial success), and the place a test can see what the tool sent."""

from __future__ import annotations

import http.server
import threading
import time
from typing import Any, NamedTuple, Sequence


class Recorded(NamedTuple):
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic() when it arrived
    status: int  # what it was answered


class Answer(NamedTuple):
    status: int = 200
    body: bytes = b"{}"
    headers: tuple[tuple[str, str], ...] = ()


class RecordingServer:
    """`answers` are given in order, one a request; once they run out every request gets `then`."""

    def __init__(self, answers: Sequence[Answer] = (), then: Answer | None = None) -> None:
        self.answers = list(answers)
        self.then = then or Answer()
        self.requests: list[Recorded] = []
        self.lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def handle_any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                arrived = time.monotonic()
                with server.lock:
                    answer = server.answers.pop(0) if server.answers else server.then
                    server.requests.append(
                        Recorded(
                            self.command,
                            self.path,
                            dict(self.headers),
                            body,
                            arrived,
                            answer.status,
                        )
                    )
                self.send_response(answer.status)
                for key, value in answer.headers:
                    self.send_header(key, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)

            do_POST = do_PUT = do_GET = handle_any

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> RecordingServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

"""A tiny hostile IMDS for tests: every path answers exactly the bytes a test sets, and may drip.

The project's emulator (``ImdsEmulator``) serves only well-formed answers and whole-response
faults; this server serves anything at all -- a body that is not UTF-8, a token with a newline,
JSON nested 100 000 deep, one byte every second -- so the client and the poller are tested
against what a broken or hostile metadata service really sends, over a real socket.
"""

from __future__ import annotations

import dataclasses
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN_PATH = "/latest/api/token"


@dataclasses.dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    drip_seconds: float = 0.0  # > 0: send the body one byte at a time, this long apart


class AdversarialImds:
    """``answers[path] = Reply(...)``; unknown paths answer 404. The token PUT answers ``token``."""

    def __init__(self) -> None:
        self.answers: dict[str, Reply] = {}
        self.token = Reply(200, b"good-token")
        self.requests: list[str] = []
        self._stop = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> AdversarialImds:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()  # drips end early, so shutdown never waits on them
        self._server.shutdown()
        self._server.server_close()

    def serve(self, path: str, body: str | bytes, status: int = 200, drip_seconds: float = 0.0) -> None:
        data = body.encode("utf-8", errors="surrogatepass") if isinstance(body, str) else body
        self.answers[path] = Reply(status, data, drip_seconds)

    def reply_for(self, method: str, path: str) -> Reply:
        self.requests.append(f"{method} {path}")
        if method == "PUT" and path == TOKEN_PATH:
            return self.token
        return self.answers.get(path, Reply(404, b"Not Found"))

    def wait_or_stop(self, seconds: float) -> bool:
        return self._stop.wait(seconds)


def _handler(server: AdversarialImds) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self._answer("GET")

        def do_PUT(self) -> None:
            self._answer("PUT")

        def _answer(self, method: str) -> None:
            reply = server.reply_for(method, self.path)
            try:
                self.send_response(reply.status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                if reply.drip_seconds <= 0:
                    self.wfile.write(reply.body)
                    return
                for index in range(len(reply.body)):
                    self.wfile.write(reply.body[index : index + 1])
                    self.wfile.flush()
                    if server.wait_or_stop(reply.drip_seconds):
                        return
            except OSError:
                pass  # the client gave up (its total time ran out): nothing more to send

    return Handler

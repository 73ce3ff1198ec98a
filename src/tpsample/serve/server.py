"""Running the app: in the foreground (`tpsample serve`) or in a background thread on a port the
OS picks (tests, `tpsample bench serve`). The socket is bound before uvicorn starts, so the port
is never guessed or hard-coded.

Contract
- `serve_forever` runs until SIGINT or SIGTERM, or until the engine fails. Then it stops
  accepting, ends every open stream at once with an error chunk and `data: [DONE]` (requests
  not streamed get a 503), waits at most `timeout_shutdown_s` for connections to close, stops the
  engine loop, and returns the exit code: 0 after a signal, 1 after an engine failure. It does
  not re-raise the signal, so the caller can stop the workers before the process exits; a
  second SIGINT skips the wait.
- Connections: `timeout_keep_alive_s` for idle kept-alive ones, `timeout_header_s` for a
  request's headers (`header_deadline_protocol`), `timeout_body_s` and the size limit for its
  body (`config.Guard`).
"""
from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
import time

from tpsample.serve.config import ServeConfig

log = logging.getLogger("tpsample.serve")
MAX_HEADER_BYTES = 16 * 1024                # a request line and headers above this are a 400 (h11)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port); port 0 lets the OS choose. ValueError if it is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.listen(2048)
    return sock


def _server(app, sock: socket.socket, log_level: str):
    import json

    import uvicorn

    from tpsample.serve.errors import error_body

    config: ServeConfig = app.state.serve_config
    late = json.dumps(error_body(408, f"the request headers did not arrive within {config.timeout_header_s:g} s "
                                      "(--timeout-header)", code="request_timeout")).encode()

    class Server(uvicorn.Server):
        """uvicorn's server that ends open streams on a signal and does not re-raise it."""

        exit_code = 0

        def handle_exit(self, sig, frame) -> None:
            super().handle_exit(sig, frame)
            app.state.engine.drain_soon("the server is shutting down")

        def engine_failed(self, error: BaseException) -> None:
            log.error("the engine stopped (%s); shutting the server down", str(error).splitlines()[0])
            self.exit_code, self.should_exit = 1, True

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            handled = (signal.SIGINT, signal.SIGTERM)
            original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

    uv = uvicorn.Config(app, log_level=log_level, access_log=log_level == "info",
                        http=header_deadline_protocol(config.timeout_header_s, late),
                        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
                        timeout_keep_alive=config.timeout_keep_alive_s,
                        timeout_graceful_shutdown=config.timeout_shutdown_s)
    server = Server(uv)
    app.state.bound_host = sock.getsockname()[0]
    app.state.engine.on_failure = server.engine_failed
    return server


def serve_forever(app, sock: socket.socket, log_level: str = "info") -> int:
    """Serve until a signal (exit code 0) or an engine failure (1); see the module contract."""
    server = _server(app, sock, log_level)
    try:
        server.run(sockets=[sock])
    finally:
        app.state.engine.shutdown()             # already done, unless a second Ctrl-C cut the shutdown short
    return server.exit_code


class BackgroundServer:
    """`with BackgroundServer(app) as srv:` serves on srv.url until the block ends."""

    def __init__(self, app, host: str = "127.0.0.1", log_level: str = "warning"):
        self.sock = bind(host, 0)
        self.host, self.port = host, self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self._server = _server(app, self.sock, log_level)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self.sock.close()


_TIMEOUT_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
                b"content-length: %d\r\n\r\n%s")


def header_deadline_protocol(timeout_header_s: float, message: bytes):
    """uvicorn's H11Protocol with a deadline on request headers (the 408 body: `message`).

    uvicorn closes a kept-alive connection idle for `timeout_keep_alive`, but a connection that
    sends nothing, or trickles its request line and headers a byte at a time, stays open forever.
    Here they must be complete within `timeout_header_s` of the connection opening, or of the
    first byte of the next request on a kept-alive connection; else a 408 and the connection is
    closed. h11 bounds their size (`MAX_HEADER_BYTES`); the body's deadline is `config.Guard`'s.
    """
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderDeadlineH11(H11Protocol):
        def connection_made(self, transport) -> None:
            self._header_timer = None
            super().connection_made(transport)
            self._arm()

        def _arm(self) -> None:
            self._header_timer = self.loop.call_later(timeout_header_s, self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def data_received(self, data: bytes) -> None:
            if self._header_timer is None and self.conn.their_state is h11.IDLE:
                self._arm()                         # the first byte of the next request
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:
                self._disarm()                      # its headers are in

        def on_response_complete(self) -> None:
            self._disarm()
            super().on_response_complete()

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                if self.cycle is None or self.cycle.response_complete:
                    self.transport.write(_TIMEOUT_408 % (len(message), message))
                self.transport.close()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderDeadlineH11

"""Running the app: in the foreground (`tpsample serve`) or in a background thread on a port the
OS picks (tests, `tpsample bench serve`). The socket is bound before uvicorn starts, so the port
is never guessed or hard-coded."""
from __future__ import annotations

import socket
import threading
import time


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
    import uvicorn

    config = uvicorn.Config(app, log_level=log_level, timeout_keep_alive=30, access_log=log_level == "info")
    return uvicorn.Server(config)


def serve_forever(app, sock: socket.socket, log_level: str = "info") -> None:
    _server(app, sock, log_level).run(sockets=[sock])


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

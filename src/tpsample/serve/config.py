"""The server's limits, timeouts and access rules (`tpsample serve` options), in one place.

Every limit answers with an OpenAI-style error body naming it; defaults suit one public
model server and can be changed from the command line (docs/serving.md lists them).
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass

MIB = 1 << 20
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class ServeConfig:
    max_body_bytes: int = 4 * MIB          # a request body above this is a 413 (Content-Length or counted)
    max_messages: int = 2048               # chat messages per request (400 above)
    max_prompt_chars: int = 1_000_000      # characters of prompt text (messages' content together; 400 above)
    timeout_keep_alive_s: float = 5.0      # an idle kept-alive connection is closed after this
    timeout_header_s: float = 10.0         # a request line and headers must arrive within this
    timeout_body_s: float = 30.0           # a request body must arrive within this (408 after)
    timeout_shutdown_s: float = 5.0        # on SIGINT / SIGTERM: the most the server waits for open connections
    grammar_timeout_s: float = 30.0        # the most a response_format grammar may take to compile (400 after)
    prep_threads: int = 4                  # threads that parse, template and tokenize request bodies
    api_key: str | None = None             # required as "Authorization: Bearer <key>" on every route but /health
    allowed_hosts: tuple[str, ...] | None = None    # Host names accepted; None: see host_names()

    def host_names(self, bound_host: str) -> frozenset[str] | None:
        """The Host header names accepted, lower-case; None accepts any.

        Given `allowed_hosts` ("*" accepts any), those; else, on a loopback address, the
        loopback names and the bound address (a browser page from elsewhere cannot reach it
        through DNS rebinding); else any.
        """
        if self.allowed_hosts is not None:
            names = {h.strip().lower().rstrip(".") for h in self.allowed_hosts if h.strip()}
            return None if "*" in names else frozenset(names)
        if not is_loopback(bound_host):
            return None
        return frozenset(LOOPBACK_NAMES + (bound_host.lower(),))


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name in a Host header, without the port: "[::1]:8000" -> "::1", "a.b:80" -> "a.b"."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    if header.count(":") == 1:
        header = header.split(":", 1)[0]
    return header.rstrip(".")

"""Checks before the app sees a request: the Host header, the API key, the body's size and time.

`Guard` wraps the ASGI app. For every HTTP request, in this order:
1. Host: a name outside `ServeConfig.host_names` is a 403 (`code: "host_not_allowed"`), the
   DNS-rebinding defence of a server on localhost.
2. API key: with one configured, every path but /health needs `Authorization: Bearer <key>`
   (401, `code: "invalid_api_key"`); compared in constant time.
3. Content type: every POST (each one a JSON endpoint) must say `Content-Type: application/json`
   (or a `+json` type), else 415 (`code: "unsupported_media_type"`): the types a web page on
   another site may send without a CORS preflight (text/plain, form data, multipart) never
   reach an endpoint, so such a page cannot make the server generate.
4. Body: a Content-Length above `max_body_bytes` is a 413 before any byte is read; the body is
   then read whole and counted as it arrives (a chunked body is a 413 once it crosses the limit),
   and must be complete within `timeout_body_s` (408, e.g. a Content-Length the body never reaches).
The app then gets the whole body in one message, and the connection's later messages (the
disconnect) as they come. Every error is an OpenAI-style body; one sent before the body was
read closes the connection.
"""
from __future__ import annotations

import asyncio
import hmac
import json

from starlette.datastructures import Headers

from tpsample.serve.config import MIB, ServeConfig, host_name
from tpsample.serve.errors import error_body

OPEN_PATHS = ("/health",)


class Guard:
    """Pure ASGI middleware (`app.add_middleware(Guard, config=...)`); streaming passes untouched."""

    def __init__(self, app, config: ServeConfig):
        self.app, self.config = app, config
        self._hosts: frozenset[str] | None | bool = False   # False: not known yet
        self._key = config.api_key.encode() if config.api_key else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            return await reply(send, *refusal)
        body, refusal = await self._read_body(receive)
        if refusal is not None:
            return await reply(send, *refusal)
        if body is not None:                        # None: the client left before it finished
            await self.app(scope, _replay(body, receive), send)

    def _refusal(self, scope, headers: Headers):
        """(status, message, code) when the request is refused before its body is read."""
        if self._hosts is False:            # the address the server listens on, set by `server`
            self._hosts = self.config.host_names(getattr(scope["app"].state, "bound_host", ""))
        host = headers.get("host")
        if self._hosts is not None and host is not None and host_name(host) not in self._hosts:
            return 403, (f"the Host header {host!r} is not one this server answers to; start it with "
                         "--allowed-hosts to add names"), "host_not_allowed"
        if self._key is not None and scope["path"] not in OPEN_PATHS:
            scheme, _, token = headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self._key):
                return 401, ("a valid API key is required: send the header Authorization: Bearer <key> "
                             "(the key the server was started with)"), "invalid_api_key"
        if scope["method"] == "POST" and not is_json(headers.get("content-type")):
            return 415, (f"the request body must be JSON, sent with Content-Type: application/json; got "
                         f"{headers.get('content-type') or 'no Content-Type'}"), "unsupported_media_type"
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.config.max_body_bytes:
            return 413, self._too_large(f"Content-Length {int(length):,}"), "request_too_large"
        return None

    def _too_large(self, what: str) -> str:
        limit = self.config.max_body_bytes
        return (f"the request body is too large: {what} bytes exceed the server's limit of {limit:,} bytes "
                f"(--max-body-mb {limit / MIB:g})")

    async def _read_body(self, receive):
        """(body, None); (None, refusal) when it is too large or too slow; (None, None) when the
        client left first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.timeout_body_s
        chunks, size = [], 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                return None, (408, f"the request body did not arrive within {self.config.timeout_body_s:g} s "
                                   "(--timeout-body)", "request_timeout")
            if message["type"] == "http.disconnect":
                return None, None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.config.max_body_bytes:
                return None, (413, self._too_large(f"more than {size:,}"), "request_too_large")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), None


def is_json(content_type: str | None) -> bool:
    """application/json or a +json type, any parameters (charset) allowed. The types a web page may
    send across sites without asking first (text/plain, forms, multipart) are not JSON."""
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _replay(body: bytes, receive):
    """A receive that gives the whole body once, then the connection's own messages."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def reply(send, status: int, message: str, code: str | None, *, close: bool = True) -> None:
    """An OpenAI-style error answer, sent straight through ASGI."""
    payload = json.dumps(error_body(status, message, code=code)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})

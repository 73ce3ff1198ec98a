"""uvicorn's h11 protocol with a deadline on request headers.

uvicorn closes a kept-alive connection that stays idle for `timeout_keep_alive`, but a new
connection that sends nothing, or one that trickles its request line and headers a byte at a
time, stays open forever. Here the request line and headers must be complete within
`timeout_header_s` of the connection opening, or of the first byte of the next request on a
kept-alive connection; otherwise the connection gets a 408 and is closed. h11 bounds their size
(uvicorn's 16 KiB default: more is a 400). The body's own deadline is `guard.Guard`'s.
"""
from __future__ import annotations

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

_TIMEOUT_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
                b"content-length: %d\r\n\r\n%s")


def header_deadline_protocol(timeout_header_s: float, message: bytes) -> type[H11Protocol]:
    """An H11Protocol class whose connections enforce `timeout_header_s` (the 408 body: `message`)."""

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

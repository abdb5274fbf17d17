"""Read timeouts, so that clients that send half a request cannot pile up in the process.

Two stages, two places:

* **The request head** (request line and headers) is read by uvicorn before any ASGI code
  runs, and uvicorn bounds neither its time nor, with httptools, its size:
  ``timeout_keep_alive`` is armed only *after* a response, between requests;
  ``h11_max_incomplete_event_size`` applies only to the h11 parser; ``limit_concurrency``
  answers 503 to everyone once half-open connections fill it. So :func:`head_limited_protocol`
  makes uvicorn's httptools protocol close a connection whose head is not complete
  ``BERTH_REQUEST_HEADER_TIMEOUT_SECONDS`` after the connection (or the previous response)
  began, with a 408, and one whose head grows past :data:`HEAD_BYTES_MAX` with a 431 —
  however the head arrives: its bytes are counted as they come while it is incomplete, and
  its request line and headers as the parser reads them, so a head that arrives whole in
  one packet (or follows another request on a kept-alive connection) is refused before the
  app sees it. ``berth serve`` runs uvicorn with it.
* **The request body** is read by the app, through ASGI ``receive()``. :class:`BodyReadTimeout`
  bounds the whole body to ``BERTH_REQUEST_BODY_TIMEOUT_SECONDS`` after its head: a request
  that announces 100 bytes and sends 10 is answered 408 problem+json and its connection
  closed. Once the body is complete, ``receive()`` is left alone (it then waits for a
  disconnect, which may rightly take as long as the response).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine, Generator
from types import CoroutineType
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.api.problems import PROBLEM_JSON, error_response
from app.errors import BerthError
from app.metrics import REQUESTS_SHED

#: Most bytes a request head may take (request line and headers); nginx allows 32 KiB.
HEAD_BYTES_MAX = 64 * 1024


class RequestTimeout(BerthError):
    """The request was not received in time; send it again, in full."""

    status = 408
    title = "Request Timeout"
    type_slug = "request-timeout"


class HeadTooLarge(BerthError):
    """The request line and headers are too large."""

    status = 431
    title = "Request Header Fields Too Large"
    type_slug = "request-header-too-large"


# --- the body: ASGI middleware --------------------------------------------------------------


def body_announced(scope: Scope) -> bool:
    """Return whether the request announces a body (HTTP/1.1: Content-Length other than 0,
    or Transfer-Encoding); a request without one has nothing to wait for."""
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value != b"0"):
            return True
    return False


class _Resumed:
    """Awaits the rest of a coroutine already run up to its first wait (``first``, what it
    yielded): the task then drives it as if it were awaited directly."""

    __slots__ = ("_coro", "_first")

    def __init__(self, coro: Coroutine[Any, Any, Any], first: Any) -> None:
        self._coro = coro
        self._first = first

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, step = self._coro, self._first
        while True:
            try:
                sent = yield step
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # a cancellation (the deadline), passed on
                try:
                    step = coro.throw(exc)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    step = coro.send(sent)
                except StopIteration as done:
                    return done.value


class BodyReadTimeout:
    """ASGI middleware answering 408 when a request body is not in within ``timeout_seconds``.

    Past the deadline, ``receive()`` tells the app the client is gone (``http.disconnect``),
    which every part of the stack already handles by giving up on the request, and whatever
    the app answers then is replaced by the 408. (An exception raised out of ``receive()``
    would not do: FastAPI turns any error while reading a body into a 400.)
    """

    def __init__(self, app: ASGIApp, *, timeout_seconds: float) -> None:
        self.app = app
        self.timeout_seconds = timeout_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on with a ``receive()`` bounded until its body is complete."""
        if scope["type"] != "http" or not body_announced(scope):
            await self.app(scope, receive, send)
            return
        deadline = asyncio.get_running_loop().time() + self.timeout_seconds
        body_complete = False
        late = False
        response_started = False

        async def receive_bounded() -> Message:
            nonlocal body_complete, late
            if body_complete:
                return await receive()
            if late:
                return {"type": "http.disconnect"}
            pending: Any = receive()
            try:
                if type(pending) is CoroutineType:
                    # Run receive() up to its first wait: a body that has already arrived
                    # (the usual case) comes back without one, and needs no deadline armed.
                    try:
                        waiting_on = pending.send(None)
                    except StopIteration as done:
                        message = done.value
                        pending = None
                    else:
                        pending = _Resumed(pending, waiting_on)
                if pending is not None:
                    async with asyncio.timeout_at(deadline):
                        message = await pending
            except TimeoutError:
                late = True
                return {"type": "http.disconnect"}
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_complete = True
            return message

        async def send_watched(message: Message) -> None:
            nonlocal response_started
            if late and not response_started:
                return  # the app's answer to a body that never came: the 408 replaces it
            if message["type"] == "http.response.start":
                response_started = True
            await send(message)

        try:
            await self.app(scope, receive_bounded, send_watched)
        except Exception:
            if not late:
                raise
            # The app gave up on the missing body by raising: the 408 is the answer.
        if not late or response_started:
            return
        REQUESTS_SHED.labels("body_timeout").inc()
        refusal = RequestTimeout(
            f"the request body was not received in full within {self.timeout_seconds:g} s "
            "of its headers (BERTH_REQUEST_BODY_TIMEOUT_SECONDS)",
            extra={"headers": {"Connection": "close"}},
        )
        await error_response(refusal)(scope, receive, send)


# --- the head: uvicorn's protocol -----------------------------------------------------------


def _raw_problem(error: BerthError) -> bytes:
    """Return a whole HTTP/1.1 problem+json answer to ``error`` that closes the connection."""
    body = json.dumps(
        {"type": error.type_uri, "title": error.title, "status": error.status,
         "detail": error.detail}
    ).encode()
    head = (
        f"HTTP/1.1 {error.status} {error.title}\r\n"
        f"content-type: {PROBLEM_JSON}\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode() + body


class _HeadOversize(Exception):
    """Raised from a parser callback: the head being parsed is past HEAD_BYTES_MAX."""


class _HeadLimited(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline and a size bound on each request head."""

    head_timeout_seconds: float = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        # The request line and headers of the head being parsed, as the parser gave them.
        self._head_parsed = 0
        self._head_oversize = False

    # A head is "open" from the connection (or the first byte of a following request) until
    # its headers are complete; the timer runs exactly while one is open.

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Start the first head's deadline with the connection."""
        super().connection_made(transport)
        self._head_open()

    def data_received(self, data: bytes) -> None:
        """Count the bytes of an open head; refuse a head that grows past the bound."""
        if self._head_timer is not None:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._head_timer is not None and self._head_bytes > HEAD_BYTES_MAX:
            REQUESTS_SHED.labels("header_too_large").inc()
            self._head_refuse(_head_too_large())

    def on_message_begin(self) -> None:
        """Start the deadline of a following request's head."""
        super().on_message_begin()
        self._head_parsed = 0
        self._head_open()

    def on_url(self, url: bytes) -> None:
        """Count the request line; stop parsing a head past the bound."""
        self._head_count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        """Count a header; stop parsing a head past the bound."""
        self._head_count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def _head_count(self, size: int) -> None:
        self._head_parsed += size
        if self._head_parsed > HEAD_BYTES_MAX:
            # The parser turns this into an HttpParserError, which uvicorn answers through
            # send_400_response: the 431 is sent from there, before the app is called.
            self._head_oversize = True
            raise _HeadOversize

    def send_400_response(self, msg: str) -> None:
        """Answer 431 to a head stopped for its size; anything else as uvicorn does."""
        if self._head_oversize:
            REQUESTS_SHED.labels("header_too_large").inc()
            self._head_refuse(_head_too_large())
            return
        super().send_400_response(msg)

    def on_headers_complete(self) -> None:
        """Stop the head's deadline: from here on the app (and its body timeout) takes over."""
        self._head_close()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the deadline of a connection that is gone."""
        self._head_close()
        super().connection_lost(exc)

    def _head_open(self) -> None:
        if self._head_timer is None:
            self._head_bytes = 0
            self._head_timer = self.loop.call_later(self.head_timeout_seconds, self._head_late)

    def _head_close(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined head is waiting behind a request still being answered: give it
            # its time again rather than cut that answer short.
            self._head_open()
            return
        REQUESTS_SHED.labels("header_timeout").inc()
        self._head_refuse(RequestTimeout(
            f"the request line and headers were not received within "
            f"{self.head_timeout_seconds:g} s (BERTH_REQUEST_HEADER_TIMEOUT_SECONDS)"
        ))

    def _head_refuse(self, error: BerthError) -> None:
        self._head_close()
        if not self.transport.is_closing():
            self.transport.write(_raw_problem(error))
            self.transport.close()


def _head_too_large() -> HeadTooLarge:
    return HeadTooLarge(f"the request line and headers are larger than {HEAD_BYTES_MAX} bytes")


def head_limited_protocol(timeout_seconds: float) -> type[HttpToolsProtocol]:
    """Return uvicorn's httptools protocol bounding each request head to ``timeout_seconds``."""
    return type("HeadLimitedProtocol", (_HeadLimited,), {"head_timeout_seconds": timeout_seconds})

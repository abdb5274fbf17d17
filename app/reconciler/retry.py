"""Bounded, jittered exponential backoff for transactions that failed transiently.

Serialization failures (40001), deadlocks (40P01) and lost connections (class 08, a server
shutting down, or a connection asyncpg reports closed) are worth another try: the
transaction rolled back as a whole, so running it again is safe. Anything else is a bug or a
broken invariant and fails at once. After the last try the error propagates: the pass fails
loudly and its claims simply expire.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
from asyncpg.exceptions import InternalClientError

from app.metrics import TRANSIENT_RETRIES

log = logging.getLogger("berth.reconciler")

T = TypeVar("T")

_SQLSTATE_KINDS = {"40001": "serialization", "40P01": "deadlock"}
#: Server shutting down or not accepting connections: the connection is gone, not the work.
_SHUTDOWN_STATES = ("57P01", "57P02", "57P03")


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        out.append(e)
        todo += [e.__cause__, e.__context__]
    return out


def transient_kind(exc: BaseException) -> str | None:
    """Return ``serialization``, ``deadlock`` or ``connection`` for a transient error, else None.

    asyncpg raises the server's errors with their SQLSTATE (``sqlstate``): 40001, 40P01,
    class 08 (connection exceptions, such as ``ConnectionDoesNotExistError``) and 57P01-03
    (server shutdown); a connection asyncpg already knows is closed raises
    ``InterfaceError``, and one the server ended while it was idle ``InternalClientError`` at
    its next statement; a socket that failed raises ``OSError``, and a timed-out connect or
    pool acquire ``TimeoutError``. The errors an error was raised from count too.
    """
    for e in _chain(exc):
        state = getattr(e, "sqlstate", None)
        if isinstance(state, str):
            if state in _SQLSTATE_KINDS:
                return _SQLSTATE_KINDS[state]
            if state.startswith("08") or state in _SHUTDOWN_STATES:
                return "connection"
        if isinstance(e, asyncpg.PostgresConnectionError | asyncpg.CannotConnectNowError):
            return "connection"
        if isinstance(e, asyncpg.InterfaceError) and "closed" in str(e):
            return "connection"
        if isinstance(e, InternalClientError):  # a connection the server ended while idle
            return "connection"
        if isinstance(e, OSError | TimeoutError):
            return "connection"
    return None


def backoff_delay(
    attempt: int, *, base_seconds: float, max_seconds: float, rng: Callable[[], float]
) -> float:
    """Return the sleep before retry ``attempt`` (1-based): full jitter over a doubling cap."""
    return rng() * min(max_seconds, base_seconds * (2 ** (attempt - 1)))


async def transient_retry(
    operation: Callable[[], Awaitable[T]],
    *,
    attempts: int,
    base_seconds: float,
    max_seconds: float = 2.0,
    what: str = "transaction",
    rng: Callable[[], float] = random.random,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> T:
    """Run ``operation``; on a transient error sleep a jittered backoff and run it again.

    At most ``attempts`` runs in all; the last transient error, or any other error, is raised.
    """
    attempt = 1
    while True:
        try:
            return await operation()
        except Exception as exc:
            kind = transient_kind(exc)
            if kind is None or attempt >= attempts:
                if kind is not None:
                    log.error(
                        "transient failures exhausted the retries",
                        extra={"what": what, "kind": kind, "attempts": attempt},
                    )
                raise
            TRANSIENT_RETRIES.labels(kind=kind).inc()
            delay = backoff_delay(attempt, base_seconds=base_seconds, max_seconds=max_seconds,
                                  rng=rng)
            log.warning(
                "transient failure; retrying",
                extra={"what": what, "kind": kind, "attempt": attempt, "delay_s": round(delay, 4)},
            )
            attempt += 1
            await sleep(delay)

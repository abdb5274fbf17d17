"""The front door: every request's headers are checked and its key verified before any body.

Pure ASGI middleware, outside every other limit, so that what a client without a valid key
can make the process do is bounded by its headers alone:

1. **Headers.** A header Berth reads as one value (:data:`SINGLETON_HEADERS`) sent more than
   once is 400, as is a text header (:data:`TEXT_HEADERS`) holding bytes that are not
   printable ASCII (``…/problems/malformed-header``): Berth never guesses which copy counts,
   and never stores bytes it would have to decode by guessing.
2. **The key**, for every ``/v1/`` path, from ``Authorization: Bearer <key>`` alone: no body
   is read first, so a request without a valid key is answered 401 without reading its body
   (and, when it announced one, its connection is closed). A key is verified at most once
   per :data:`app.auth.KEY_CACHE_SECONDS` per process, whether it is valid
   (:class:`app.auth.KeyCache`) or not (:class:`app.auth.KeyRefusals`). Looking a key up
   costs a database query, so two bounds keep clients with invalid keys from buying many:

   * each client address may have ``BERTH_INVALID_KEYS_PER_SECOND`` (bursts of
     ``BERTH_INVALID_KEY_BURST_REQUESTS``) keys fail verification: a look-up of a key this
     process has not verified before takes a token of the address's bucket first (given
     back when the key is valid), and with none left the key is answered 429 with
     ``Retry-After`` without a query.
     A key verified here before (cached, even expired) is looked up again regardless, so a
     flood from a shared address does not lock out the clients whose keys are known;
   * at most ``BERTH_MAX_UNAUTHENTICATED_REQUESTS`` look-ups run at once; past that, 503.
3. **The key's rate limit** (``BERTH_RATE_LIMIT_*``, off by default), keyed by the verified
   key's id: however the header is spelled, one key has one bucket.

The verified principal is left in the ASGI scope (:data:`app.auth.PRINCIPAL_SCOPE_KEY`) for
the routes, and only then does the request reach the in-flight bound
(:class:`app.api.shedding.InFlightLimit`): its slots go to authenticated work only.
Refusals carry no key, and their metrics no key or address.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.problems import database_error, error_response
from app.api.shedding import EXEMPT_PATHS, Overloaded, RateLimited, TokenBuckets
from app.api.timeouts import body_announced
from app.auth import (
    PRINCIPAL_SCOPE_KEY,
    KeyCache,
    KeyRefusals,
    Principal,
    bearer_key,
    key_use_record,
    principal_verify,
)
from app.errors import BerthError, Unauthorized
from app.ledger.keys import key_hash
from app.metrics import REQUESTS_SHED, REQUESTS_UNAUTHENTICATED

#: Headers Berth reads as a single value: sent twice, the request is refused.
SINGLETON_HEADERS = frozenset({
    b"authorization", b"content-type", b"content-length", b"host", b"idempotency-key",
    b"if-match", b"x-berth-tenant",
})
#: Headers whose value Berth reads as text: only printable ASCII (and spaces, tabs) is taken.
TEXT_HEADERS = frozenset({
    b"authorization", b"content-type", b"idempotency-key", b"if-match", b"x-berth-tenant",
})

#: A byte that is not printable ASCII, a space or a tab.
_NOT_TEXT = re.compile(rb"[^\x20-\x7e\t]")
_AUTHORIZATION = b"authorization"
_API_PREFIX = "/v1/"
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


class MalformedHeader(BerthError):
    """A request header is repeated or is not ASCII text."""

    status = 400
    title = "Bad Request"
    type_slug = "malformed-header"


def headers_check(headers: list[tuple[bytes, bytes]]) -> MalformedHeader | None:
    """Return the 400 of a repeated singleton header or a non-ASCII text header, or None."""
    seen: set[bytes] = set()
    for name, value in headers:
        if name not in SINGLETON_HEADERS:
            continue
        if name in seen:
            return MalformedHeader(
                f"the {name.decode()} header is sent more than once; send it once"
            )
        seen.add(name)
        if name in TEXT_HEADERS and not _printable(value):
            return MalformedHeader(
                f"the {name.decode()} header holds bytes that are not printable ASCII text"
            )
    return None


def _printable(value: bytes) -> bool:
    return _NOT_TEXT.search(value) is None


def _header(scope: Scope, wanted: bytes) -> bytes | None:
    for name, value in scope["headers"]:
        if name == wanted:
            return value  # type: ignore[no-any-return]
    return None


class FrontDoor:
    """ASGI middleware: header checks, key verification and the key's rate limit."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_unauthenticated: int,
        invalid_keys_per_second: float,
        invalid_key_burst: int,
        rate_per_second: float = 0.0,
        rate_burst: int = 1,
    ) -> None:
        self.app = app
        self.max_unauthenticated = max_unauthenticated
        self.refusals = KeyRefusals()
        self.invalid_keys = TokenBuckets(
            rate_per_second=invalid_keys_per_second, burst=invalid_key_burst
        )
        self.key_buckets = (
            TokenBuckets(rate_per_second=rate_per_second, burst=rate_burst)
            if rate_per_second > 0 else None
        )
        #: Key look-ups in progress (requests not yet authenticated), one per key at most.
        self.verifying = 0
        self._lookups: dict[str, asyncio.Future[Principal | None]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on, authenticated when its path is under ``/v1/``, or refuse it."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        malformed = headers_check(scope["headers"])
        if malformed is not None:
            await self._refuse(malformed, scope, receive, send)
            return
        path: str = scope["path"]
        if not path.startswith(_API_PREFIX) or path in EXEMPT_PATHS:
            await self.app(scope, receive, send)
            return
        outcome = await self._authenticate(scope)
        if not isinstance(outcome, Principal):
            if isinstance(outcome, BerthError):
                await self._refuse(outcome, scope, receive, send)
            else:
                await outcome(scope, receive, send)
            return
        if self.key_buckets is not None:
            assert outcome.key_id is not None
            wait = self.key_buckets.take(outcome.key_id.bytes, now=time.monotonic())
            if wait > 0:
                REQUESTS_SHED.labels("rate_limit").inc()
                seconds = max(1, math.ceil(wait))
                await self._refuse(RateLimited(
                    f"this API key sent more than {self.key_buckets.rate:g} requests per second "
                    f"(bursts of {self.key_buckets.burst:g}); retry in {seconds} s",
                    extra={"headers": {"Retry-After": str(seconds)}},
                ), scope, receive, send)
                return
        scope[PRINCIPAL_SCOPE_KEY] = outcome
        await self.app(scope, receive, send)

    async def _authenticate(self, scope: Scope) -> Principal | BerthError | JSONResponse:
        """Return the request's principal, or the error (or response) refusing it."""
        authorization = _header(scope, _AUTHORIZATION)
        key = bearer_key(authorization.decode("ascii")) if authorization else None
        if key is None:
            REQUESTS_UNAUTHENTICATED.labels("no_key").inc()
            return Unauthorized(extra={"headers": dict(_CHALLENGE)})
        digest = key_hash(key)
        state = scope["app"].state._state
        cache: KeyCache = state["key_cache"]
        now = cache.clock()
        principal = cache.get(digest, now)
        if principal is not None:
            return principal
        if self.refusals.refused(digest, now):
            REQUESTS_UNAUTHENTICATED.labels("refused_key").inc()
            return _invalid_key()
        try:
            pending = self._lookups.get(digest)
            if pending is not None:
                # The same key is being looked up for another request: share that answer.
                try:
                    principal = await asyncio.shield(pending)
                except asyncio.CancelledError:
                    task = asyncio.current_task()
                    if not pending.cancelled() or (task is not None and task.cancelling()):
                        raise
                    return Overloaded("the API key's check was interrupted; retry in a second",
                                      extra={"headers": {"Retry-After": "1"}})
                return principal if principal is not None else _invalid_key()
            return await self._lookup(scope, state, key=key, digest=digest, now=now)
        except Exception as exc:
            return await database_error(Request(scope), exc)

    async def _lookup(
        self, scope: Scope, state: dict[str, Any], *, key: str, digest: str, now: float
    ) -> Principal | BerthError:
        """Look ``key`` up in the database, within the invalid-key budget and the bound."""
        cache: KeyCache = state["key_cache"]
        known = cache.known(digest)
        address = _address(scope)
        if not known:
            # The token is taken before the look-up, so concurrent look-ups cannot overdraw
            # the budget; it is given back when the key turns out valid.
            wait = self.invalid_keys.take(address, now=now)
            if wait > 0:
                REQUESTS_SHED.labels("invalid_key_limit").inc()
                seconds = max(1, math.ceil(wait))
                return RateLimited(
                    f"this client address sent more than {self.invalid_keys.rate:g} invalid API "
                    f"keys per second (bursts of {self.invalid_keys.burst:g}); its keys are not "
                    f"checked for {seconds} s",
                    extra={"headers": {"Retry-After": str(seconds)}},
                )
        if self.verifying >= self.max_unauthenticated:
            REQUESTS_SHED.labels("unauthenticated_limit").inc()
            if not known:
                self.invalid_keys.give_back(address)
            return Overloaded(
                f"Berth is verifying {self.max_unauthenticated} API keys, its limit per process "
                "(BERTH_MAX_UNAUTHENTICATED_REQUESTS); retry in a second",
                extra={"headers": {"Retry-After": "1"}},
            )
        lookup: asyncio.Future[Principal | None] = asyncio.get_running_loop().create_future()
        self._lookups[digest] = lookup
        self.verifying += 1
        try:
            verified = await principal_verify(
                state["db"], cache, key=key, digest=digest, now=now
            )
            principal = verified[0] if verified is not None else None
        except asyncio.CancelledError:
            lookup.cancel()  # the requests waiting on it are answered 503 (retry)
            raise
        except Exception as exc:
            if not known:
                self.invalid_keys.give_back(address)
            lookup.set_exception(exc)
            lookup.exception()  # retrieved here, whether or not another request waits on it
            raise
        else:
            lookup.set_result(principal)
        finally:
            del self._lookups[digest]
            self.verifying -= 1
        if principal is None:
            REQUESTS_UNAUTHENTICATED.labels("invalid_key").inc()
            self.refusals.put(digest, now)
            return _invalid_key()
        if not known:
            self.invalid_keys.give_back(address)
        # After the answer was shared: a write that waits (a synchronous standby away) holds
        # up this request only, never the others of the key.
        assert verified is not None
        await key_use_record(state["db"], verified[1])
        return principal

    async def _refuse(self, error: BerthError, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer ``error``; close the connection when a body was announced and left unread."""
        if body_announced(scope):
            headers = dict(error.extra.get("headers") or {})
            headers["Connection"] = "close"
            error.extra["headers"] = headers
        await error_response(error)(scope, receive, send)


def _invalid_key() -> Unauthorized:
    return Unauthorized("the API key is not valid", extra={"headers": dict(_CHALLENGE)})


def _address(scope: Scope) -> bytes:
    client = scope.get("client")
    return client[0].encode() if client else b""

"""Load shedding: a bound on the requests one process works on, and token buckets.

* :class:`InFlightLimit` — pure ASGI middleware: past ``BERTH_MAX_IN_FLIGHT_REQUESTS``
  requests in progress, a new one is answered 503 with ``Retry-After`` at once instead of
  queueing behind the others for a database connection. It sits behind the front door
  (:mod:`app.api.front_door`), so it counts only requests whose key was verified: clients
  without a valid key cannot take its slots. The probes and the scrape (``/healthz``,
  ``/readyz``, ``/metrics``) are exempt: an overloaded process is alive, and its metrics are
  what shows the overload.
* :class:`TokenBuckets` — the rate limits the front door applies: per verified API key
  (``BERTH_RATE_LIMIT_*``, off by default) and, for keys that fail verification, per client
  address (``BERTH_INVALID_KEY*``). At most :data:`BUCKETS_MAX` buckets are kept (the least
  recently used go first).

Every limit is per process: N API replicas admit N times as much.
"""

from __future__ import annotations

from collections import OrderedDict

from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.problems import error_response
from app.errors import BerthError
from app.metrics import REQUESTS_SHED

#: Paths never shed: liveness, readiness and the metrics scrape.
EXEMPT_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
#: Paths that take no in-flight slot: watches are long-lived and bounded by their own
#: limits (app.services.watch_hub), so that idle watchers cannot starve the API.
UNSLOTTED_PATHS = frozenset({"/v1/watch"})

#: Most token buckets kept at once (a few hundred bytes each: a few MB at most).
BUCKETS_MAX = 10_000


class Overloaded(BerthError):
    """Berth is working on as many requests as it may at once; retry shortly."""

    status = 503
    title = "Service Unavailable"
    type_slug = "overloaded"


class RateLimited(BerthError):
    """This client sent more requests than its rate limit allows; retry later."""

    status = 429
    title = "Too Many Requests"
    type_slug = "rate-limited"


class InFlightLimit:
    """ASGI middleware answering 503 while ``max_in_flight`` requests are in progress."""

    def __init__(self, app: ASGIApp, *, max_in_flight: int) -> None:
        self.app = app
        self.max_in_flight = max_in_flight
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on, or answer 503 when the process is full."""
        if scope["type"] != "http" or scope["path"] in EXEMPT_PATHS or (
                scope["path"] in UNSLOTTED_PATHS):
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.max_in_flight:
            REQUESTS_SHED.labels("in_flight_limit").inc()
            refusal = Overloaded(
                f"Berth is working on {self.max_in_flight} requests, its limit per process "
                "(BERTH_MAX_IN_FLIGHT_REQUESTS); retry in a second",
                extra={"headers": {"Retry-After": "1"}},
            )
            await error_response(refusal)(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


class TokenBuckets:
    """Token buckets by key: ``rate_per_second`` refill, ``burst`` capacity, bounded count."""

    def __init__(
        self, *, rate_per_second: float, burst: int, max_keys: int = BUCKETS_MAX
    ) -> None:
        if rate_per_second <= 0:
            raise ValueError("rate_per_second must be positive")
        self.rate = rate_per_second
        self.burst = float(burst)
        self.max_keys = max_keys
        # key -> (tokens left, when they were counted); oldest use first.
        self._buckets: OrderedDict[bytes, tuple[float, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def give_back(self, key: bytes) -> None:
        """Return one token taken from ``key``'s bucket (what it paid for turned out free)."""
        entry = self._buckets.get(key)
        if entry is not None:
            self._buckets[key] = (min(self.burst, entry[0] + 1.0), entry[1])

    def take(self, key: bytes, *, now: float) -> float:
        """Take one token of ``key``'s bucket: return 0.0, or the seconds until one is there."""
        tokens, counted_at = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + max(0.0, now - counted_at) * self.rate)
        if tokens >= 1.0:
            tokens -= 1.0
            wait = 0.0
        else:
            wait = (1.0 - tokens) / self.rate
        self._buckets[key] = (tokens, now)
        if len(self._buckets) > self.max_keys:
            # A forgotten bucket comes back full: that only ever favours its key.
            self._buckets.popitem(last=False)
        return wait

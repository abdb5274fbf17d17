"""HTTP metrics whose labels come only from fixed sets: route templates and known methods.

prometheus-fastapi-instrumentator labels a request by the template of the route it matched
and groups requests that match none under ``none`` (``should_group_untemplated``). One case
escapes that grouping: a path that matches a route only after adding or removing a trailing
slash (``GET /v1/pools/<anything>/``, which Starlette answers with a 307 redirect) is labelled
with its *raw path*, so anyone, without a key, could add a series per request and put any
string, another tenant's task id included, into ``/metrics``. The request method is copied
as sent, too, and a client may send any token there.

So :class:`HttpMetrics`, which records the instrumentator's default metric families in its
place, checks both labels against fixed sets before recording: a ``handler`` that is not the
path template of one of the app's routes becomes :data:`UNMATCHED`, and a method outside
:data:`METHODS` becomes :data:`OTHER_METHOD`. Whatever the router does, a label can only take
a value the code defines. The instrumentator still serves ``/metrics``.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from timeit import default_timer

from fastapi import FastAPI
from prometheus_client import CollectorRegistry, Counter, Histogram, Summary
from prometheus_fastapi_instrumentator import Instrumentator
from prometheus_fastapi_instrumentator.routing import get_route_name
from starlette.requests import Request
from starlette.routing import BaseRoute, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: The ``handler`` of every request that matched no route template.
UNMATCHED = "none"
#: The ``method`` of every request whose method is not in :data:`METHODS`.
OTHER_METHOD = "other"
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
#: Most paths whose route template is remembered (see ``HttpMetrics._handler``).
ROUTE_NAMES_MAX = 1024

#: Not counted: a scrape would otherwise count itself.
EXCLUDED = ("^/metrics$",)

#: The instrumentator's default buckets (``metrics.default``), +Inf added as it does.
LATENCY_HIGHR_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 2.5, 3,
                         3.5, 4, 4.5, 5, 7.5, 10, 30, 60, float("inf"))
LATENCY_LOWR_BUCKETS = (0.1, 0.5, 1, float("inf"))


def route_templates(routes: Iterable[BaseRoute], prefix: str = "") -> Iterator[str]:
    """Yield the path template of every route, included routers and mounts too."""
    for route in routes:
        contexts = getattr(route, "effective_route_contexts", None)
        if callable(contexts):  # a router included by FastAPI (>= 0.116)
            for context in contexts():
                inner = getattr(context, "starlette_route", None) or context
                yield from route_templates([inner], prefix)
            continue
        path = getattr(route, "path", None)
        if path is None:
            continue
        yield prefix + path
        if isinstance(route, Mount) and route.routes:
            yield from route_templates(route.routes, prefix + path)


class HttpMetrics:
    """ASGI middleware recording each request in the five families of the instrumentator's
    default set (``prometheus_fastapi_instrumentator.metrics.default``): same names, labels,
    buckets and values, recorded directly.

    The instrumentator's own middleware matches every request against the app's routes a
    second time (before the router does), then builds a Request, a Response and an Info per
    request to hand them to the metric functions: about a quarter of a task submit's or read's
    CPU. Here the handler is the route the router matched (FastAPI leaves it in the scope as
    ``route``); only a request no API route matched (404, a redirect, a mount) is resolved
    by the instrumentator's own function, as before.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        registry: CollectorRegistry,
        templates: Callable[[], frozenset[str]],
        should_include_root_path: bool = False,
    ) -> None:
        self.app = app
        self._templates = templates
        self._known: frozenset[str] | None = None
        # The route template of a path that never reached the router (a request refused by
        # the front door or a limit), by path: matching every route again for each refusal
        # of a flood would cost more than the refusal. Bounded; the oldest go first.
        self._names: OrderedDict[str, str | None] = OrderedDict()
        self._excluded = [re.compile(pattern) for pattern in EXCLUDED]
        self._should_include_root_path = should_include_root_path
        self._total = Counter(
            "http_requests_total",
            "Total number of requests by method, status and handler.",
            ("method", "status", "handler"),
            registry=registry,
        )
        self._in_size = Summary(
            "http_request_size_bytes",
            "Content length of incoming requests by handler. "
            "Only value of header is respected. Otherwise ignored. "
            "No percentile calculated. ",
            ("handler",),
            registry=registry,
        )
        self._out_size = Summary(
            "http_response_size_bytes",
            "Content length of outgoing responses by handler. "
            "Only value of header is respected. Otherwise ignored. "
            "No percentile calculated. ",
            ("handler",),
            registry=registry,
        )
        self._latency_highr = Histogram(
            "http_request_duration_highr_seconds",
            "Latency with many buckets but no API specific labels. "
            "Made for more accurate percentile calculations. ",
            buckets=LATENCY_HIGHR_BUCKETS,
            registry=registry,
        )
        self._latency_lowr = Histogram(
            "http_request_duration_seconds",
            "Latency with only few buckets by handler. "
            "Made to be only used if aggregation by handler is important. ",
            ("method", "handler"),
            buckets=LATENCY_LOWR_BUCKETS,
            registry=registry,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on, then record it (unless it is a scrape)."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = default_timer()
        status_code = 500
        response_length = 0

        async def send_watched(message: Message) -> None:
            nonlocal status_code, response_length
            if message["type"] == "http.response.start":
                status_code = message["status"]
                for name, value in message.get("headers") or ():
                    if name.lower() == b"content-length":
                        response_length = int(value)
                        break
            await send(message)

        try:
            await self.app(scope, receive, send_watched)
        finally:
            self._record(scope, status_code, response_length, default_timer() - start)

    def _handler(self, scope: Scope) -> str:
        route = scope.get("route")
        name = getattr(route, "path", None) if route is not None else None
        if name is None or (self._should_include_root_path and scope.get("root_path")):
            path = scope.get("root_path", "") + scope["path"]
            if path in self._names:
                name = self._names[path]
            else:
                name = get_route_name(
                    Request(scope), should_include_root_path=self._should_include_root_path
                )
                self._names[path] = name
                if len(self._names) > ROUTE_NAMES_MAX:
                    self._names.popitem(last=False)
        return name if name is not None else scope["path"]

    def _record(self, scope: Scope, status_code: int, response_length: int,
                duration: float) -> None:
        handler = self._handler(scope)
        if any(pattern.search(handler) for pattern in self._excluded):
            return
        if self._known is None:  # every route exists once requests arrive
            self._known = self._templates()
        if handler not in self._known:  # untemplated, or a path that is no template
            handler = UNMATCHED
        method = scope["method"]
        if method not in METHODS:
            method = OTHER_METHOD
        status = str(status_code)[0] + "xx"
        self._total.labels(method, status, handler).inc()
        request_length = 0
        for name, value in scope["headers"]:
            if name == b"content-length":
                request_length = int(value)
                break
        self._in_size.labels(handler).observe(request_length)
        self._out_size.labels(handler).observe(response_length)
        self._latency_highr.observe(duration)
        self._latency_lowr.labels(method, handler).observe(duration)


def http_metrics_install(app: FastAPI, *, registry: CollectorRegistry) -> None:
    """Count ``app``'s requests in ``registry`` with bounded labels and serve it at /metrics."""
    app.add_middleware(
        HttpMetrics, registry=registry, templates=lambda: frozenset(route_templates(app.routes))
    )
    Instrumentator(registry=registry).expose(app, endpoint="/metrics", include_in_schema=False)

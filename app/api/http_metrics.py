"""HTTP metrics whose labels come only from fixed sets: route templates and known methods.

prometheus-fastapi-instrumentator labels a request by the template of the route it matched
and groups requests that match none under ``none`` (``should_group_untemplated``). One case
escapes that grouping: a path that matches a route only after adding or removing a trailing
slash (``GET /v1/pools/<anything>/``, which Starlette answers with a 307 redirect) is labelled
with its *raw path*, so anyone, without a key, could add a series per request and put any
string, another tenant's task id included, into ``/metrics``. The request method is copied
as sent, too, and a client may send any token there.

So the one instrumentation installed here checks both labels against fixed sets before
recording: a ``handler`` that is not the path template of one of the app's routes becomes
:data:`UNMATCHED`, and a method outside :data:`METHODS` becomes :data:`OTHER_METHOD`.
Whatever the router does, a label can only take a value the code defines (SPEC §7).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from prometheus_fastapi_instrumentator import Instrumentator, metrics
from starlette.routing import BaseRoute, Mount

#: The ``handler`` of every request that matched no route template.
UNMATCHED = "none"
#: The ``method`` of every request whose method is not in :data:`METHODS`.
OTHER_METHOD = "other"
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

#: Not counted: a scrape would otherwise count itself.
EXCLUDED = ("^/metrics$",)


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


def bounded_labels(app: FastAPI, record: Callable[[metrics.Info], None]):  # type: ignore[no-untyped-def]
    """Return an instrumentation that calls ``record`` with labels from fixed sets only."""
    templates: frozenset[str] | None = None

    def instrumentation(info: metrics.Info) -> None:
        nonlocal templates
        if templates is None:  # every route exists once requests arrive
            templates = frozenset(route_templates(app.routes))
        if info.modified_handler not in templates:
            info.modified_handler = UNMATCHED
        if info.method not in METHODS:
            info.method = OTHER_METHOD
        record(info)

    return instrumentation


def http_metrics_install(app: FastAPI, *, registry: CollectorRegistry) -> None:
    """Count ``app``'s requests in ``registry`` with bounded labels and serve it at /metrics."""
    record = metrics.default(registry=registry)
    assert record is not None
    instrumentator = Instrumentator(
        should_group_untemplated=True,
        excluded_handlers=list(EXCLUDED),
        registry=registry,
    )
    instrumentator.add(bounded_labels(app, record))
    instrumentator.instrument(app).expose(app, endpoint="/metrics", include_in_schema=False)

"""The one problem+json (RFC 9457) rendering of every error the API answers with."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import asyncpg
from asyncpg.exceptions import InternalClientError
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.errors import BerthError, Unprocessable
from app.logs import LogSummary
from app.metrics import DATABASE_UNAVAILABLE

log = logging.getLogger("berth.api")
#: A database that is down or a pool that is busy answers every request 503: logged as a
#: summary (the metric berth_http_database_unavailable_total counts each one).
_UNAVAILABLE_LOG = LogSummary(log, "database unavailable")

PROBLEM_JSON = "application/problem+json"

_TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    406: "Not Acceptable",
    409: "Conflict",
    412: "Precondition Failed",
    413: "Payload Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def problem_response(
    status: int,
    *,
    title: str | None = None,
    detail: str,
    type_uri: str = "about:blank",
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    """Return an ``application/problem+json`` response."""
    body = problem_json(status, title=title, detail=detail, type_uri=type_uri, **extra)
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def problem_json(
    status: int, *, title: str | None = None, detail: str, type_uri: str = "about:blank",
    **extra: Any,
) -> dict[str, Any]:
    """Return the body of a problem answer (RFC 9457)."""
    return {
        "type": type_uri,
        "title": title or _TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
        **extra,
    }


def _loc(loc: tuple[Any, ...] | list[Any]) -> list[str | int]:
    return [p if isinstance(p, int) else str(p) for p in loc]


def validation_errors(errors: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Return pydantic/FastAPI errors as problem ``errors`` entries [{loc, msg}]."""
    return [{"loc": _loc(e.get("loc", ())), "msg": str(e.get("msg", ""))} for e in errors]


def error_response(exc: BerthError) -> JSONResponse:
    """Return the problem+json answer of ``exc`` (its ``extra["headers"]`` become headers)."""
    extra = dict(exc.extra)
    headers = extra.pop("headers", None)
    return problem_response(
        exc.status,
        title=exc.title,
        detail=exc.detail,
        type_uri=exc.type_uri,
        headers=headers,
        **extra,
    )


async def _berth_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, BerthError)
    return error_response(exc)


def validation_problem_json(raw_errors: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Return the body of the 422 problem of pydantic/FastAPI validation errors."""
    errors = validation_errors(raw_errors)
    first: dict[str, Any] = errors[0] if errors else {"loc": [], "msg": "invalid request"}
    where = ".".join(str(p) for p in first["loc"])
    return problem_json(
        422,
        title=Unprocessable.title,
        detail=f"{where}: {first['msg']}" if where else first["msg"],
        type_uri="https://berth.dev/problems/validation",
        errors=errors,
    )


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    body = validation_problem_json(list(exc.errors()))
    return JSONResponse(body, status_code=422, media_type=PROBLEM_JSON)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    detail = exc.detail if isinstance(exc.detail, str) else _TITLES.get(exc.status_code, "Error")
    return problem_response(exc.status_code, detail=detail, headers=exc.headers)


#: SQLSTATEs of text PostgreSQL cannot store (a NUL character): bad input, not a server fault.
_BAD_TEXT_SQLSTATES = frozenset({"22021", "22P05"})


#: SQLSTATE classes and codes that mean "the database cannot serve us right now": connection
#: exceptions (08), too many connections (53300), shutdown (57P01..57P03), a write that
#: reached a standby during a failover (25006), and transaction rollbacks a retry resolves
#: (40001 serialization failure, 40P01 deadlock).
_UNAVAILABLE_SQLSTATES = frozenset(
    {"53300", "57P01", "57P02", "57P03", "25006", "40001", "40P01"}
)


def database_unavailable(exc: BaseException) -> bool:
    """Return whether ``exc`` means the database is unreachable or asks for a retry."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError | ConnectionError | TimeoutError):
            return True
        sqlstate = getattr(current, "sqlstate", None)
        if isinstance(sqlstate, str) and (
            sqlstate.startswith("08") or sqlstate in _UNAVAILABLE_SQLSTATES
        ):
            return True
        if isinstance(current, InternalClientError):
            return True
        if type(current).__module__.startswith("asyncpg") and type(current).__name__ in {
            "ConnectionDoesNotExistError",
            "InterfaceError",
            "CannotConnectNowError",
            "TooManyConnectionsError",
            # A multi-host URL whose every answering host is a standby (a failover).
            "TargetServerAttributeNotMatched",
        }:
            return True
        current = current.__cause__ or current.__context__
    return False


def _unavailable(request: Request, exc: Exception) -> JSONResponse:
    DATABASE_UNAVAILABLE.inc()
    _UNAVAILABLE_LOG.note(type(exc).__name__, path=request.url.path, method=request.method)
    return problem_response(
        503,
        detail="the database is unavailable or busy; retry shortly",
        type_uri="https://berth.dev/problems/unavailable",
        headers={"Retry-After": "1"},
    )


async def database_error(request: Request, exc: Exception) -> JSONResponse:
    """Return the answer to a database error: 503 when unavailable or busy, 409 for a
    refused constraint, 422 for a NUL in text, else the logged 500."""
    if database_unavailable(exc):
        return _unavailable(request, exc)
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate in _BAD_TEXT_SQLSTATES:
        return problem_response(
            422,
            detail="a string in the request contains a NUL character (\\u0000), "
            "which cannot be stored",
            type_uri="https://berth.dev/problems/validation",
        )
    if isinstance(sqlstate, str) and sqlstate.startswith("23"):
        # An integrity constraint refused the change (at a statement or at COMMIT, for a
        # deferred one): the transaction rolled back as a whole, so nothing was stored.
        log.warning(
            "constraint refused a write",
            extra={"path": request.url.path, "method": request.method, "sqlstate": sqlstate},
        )
        return problem_response(
            409,
            detail="the change conflicts with the current state of the ledger and was not "
            "stored; read the resource again and retry",
            type_uri="https://berth.dev/problems/conflict",
        )
    return await _unexpected(request, exc)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    if database_unavailable(exc):
        return _unavailable(request, exc)
    request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
    log.error(
        "unhandled error",
        exc_info=exc,
        extra={"request_id": request_id, "path": request.url.path, "method": request.method},
    )
    return problem_response(
        500,
        detail=f"An unexpected error occurred; it was logged with request id {request_id}.",
        type_uri="https://berth.dev/problems/internal",
        requestId=request_id,
    )


def problems_install(app: FastAPI) -> None:
    """Install the problem+json handlers on ``app``."""
    app.add_exception_handler(BerthError, _berth_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(asyncpg.PostgresError, database_error)
    app.add_exception_handler(asyncpg.InterfaceError, database_error)
    # asyncpg's own client-side errors: a connection the server ended while it sat idle in
    # the pool (a restart sends 57P01, then closes) fails its next statement with "cannot
    # switch to state …; another operation (2) is in progress". asyncpg has discarded it.
    app.add_exception_handler(InternalClientError, database_error)
    # A refused, reset or timed-out connection to PostgreSQL is an OSError or TimeoutError.
    # Handled here, inside the middleware stack, the 503 is the app's answer; left to the
    # catch-all (Starlette's outermost middleware) it would also be re-raised to the server,
    # which logs a traceback per request for as long as the database is away.
    app.add_exception_handler(OSError, _unexpected)
    app.add_exception_handler(TimeoutError, _unexpected)
    app.add_exception_handler(Exception, _unexpected)

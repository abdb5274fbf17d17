"""Requests read strictly: the body's media type (415), the JSON itself (400), the names of
the query parameters (422).

A request body reaches a model only as one well-formed JSON document in UTF-8, sent as
``application/json`` (or a type a route names, e.g. ``application/merge-patch+json``):

* any other ``Content-Type``, or none, with a non-empty body is **415**, and the problem
  names the types the operation accepts;
* a body that is not JSON is **400** (``…/problems/malformed-body``): a syntax error, bytes
  that are not UTF-8 (or a lone UTF-16 surrogate escape, which no UTF-8 text can hold),
  ``NaN``/``Infinity`` (not JSON), an object that repeats a key (RFC 8259 leaves the
  meaning of a repeat open; Berth refuses to guess which one counts), nesting deeper than
  :data:`DEPTH_MAX`, more than :data:`VALUES_MAX` values, or an integer of more digits than
  Python converts (4,300);
* what is left is a schema question, answered by the strict request models with **422**.

The depth and the number of values are measured on the text, before it is parsed, so no
parser (nor orjson's write-back, which stops at 255 levels) ever sees a document deeper than
:data:`DEPTH_MAX`. A body over :data:`OFF_LOOP_BYTES` (a task batch) is parsed in a worker
thread, so that one large body does not hold up the other requests of the process.

:class:`StrictRoute` applies this to every FastAPI route that declares a body, before
FastAPI decodes it (FastAPI then reuses the decoded value); the direct routes
(:mod:`app.api.direct_routes`) call :func:`json_body_read` themselves.
"""

from __future__ import annotations

import asyncio
import email.message
import json
import re
from collections.abc import Callable, Coroutine, Sequence
from typing import Any
from urllib.parse import parse_qsl

import orjson
from fastapi import Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

from app.errors import BerthError

__all__ = [
    "DEPTH_MAX",
    "JSON",
    "MalformedBody",
    "StrictRoute",
    "UnsupportedMediaType",
    "OFF_LOOP_BYTES",
    "VALUES_MAX",
    "json_body_read",
    "json_decode",
    "media_type_check",
]

JSON = "application/json"

#: Deepest nesting of arrays and objects a body may have (a task spec needs 5).
DEPTH_MAX = 64
#: Most values (array items, object members and containers) a body may hold: a batch of
#: 1,000 task specs each with every list and map at its largest holds about 350,000.
VALUES_MAX = 500_000
#: Bodies larger than this are parsed in a worker thread, off the event loop.
OFF_LOOP_BYTES = 64 * 1024

#: A JSON string (its escapes included): what the structure of a text is measured without.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
#: Every byte but the brackets deleted, and ``{}`` read as ``[]`` (depth is the same).
_BRACKETS_TABLE = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")

#: A ``\\uD800``-``\\uDFFF`` escape: the only way a JSON text can smuggle a lone surrogate.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abAB]|\\u[dD][c-fC-F]")


class MalformedBody(BerthError):
    """The request body is not a JSON document."""

    status = 400
    title = "Bad Request"
    type_slug = "malformed-body"


class UnsupportedMediaType(BerthError):
    """The request body is not of a media type this operation accepts."""

    status = 415
    title = "Unsupported Media Type"
    type_slug = "unsupported-media-type"


def media_type_check(content_type: str | None, accepted: Sequence[str] = (JSON,)) -> None:
    """Raise 415 unless ``content_type`` is one of ``accepted`` (charset utf-8 at most)."""
    if content_type in accepted:  # the plain case, without parsing parameters
        return
    if content_type:
        message = email.message.Message()
        message["content-type"] = content_type
        media_type = message.get_content_type()
        charset = message.get_param("charset")
        if media_type in accepted and (
            charset is None or (isinstance(charset, str) and charset.lower() in ("utf-8", "utf8"))
        ):
            return
    names = " or ".join(f"`{a}`" for a in accepted)
    raise UnsupportedMediaType(
        f"send the body as {names} (UTF-8), not "
        + (f"`{content_type}`" if content_type else "without a Content-Type"),
        extra={"headers": {"Accept": ", ".join(accepted)}},
    )


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise MalformedBody(f"the JSON object repeats the key {key!r}")
            seen.add(key)
    return value


def _constant(name: str) -> Any:
    raise MalformedBody(f"{name} is not JSON: numbers must be finite")


_DECODER = json.JSONDecoder(object_pairs_hook=_object, parse_constant=_constant)


def _structure_check(raw: bytes) -> None:
    """Raise 400 when ``raw`` holds more than VALUES_MAX values or nests deeper than
    DEPTH_MAX, both counted outside its strings (exact for a JSON text)."""
    # Without a backslash no quote is escaped, and every other piece between quotes is
    # outside the strings; with one, the strings are matched whole.
    bare = b"".join(raw.split(b'"')[::2]) if b"\\" not in raw else _STRING.sub(b"", raw)
    brackets = bare.translate(_BRACKETS_TABLE, _NOT_BRACKETS)
    if bare.count(b",") + len(brackets) // 2 > VALUES_MAX:
        raise MalformedBody(f"the JSON holds more than {VALUES_MAX} values")
    # Each round removes the innermost (empty) arrays: a text nested d levels deep is empty
    # after d rounds.
    for _ in range(DEPTH_MAX):
        if not brackets:
            return
        brackets = brackets.replace(b"[]", b"")
    if brackets:
        raise MalformedBody(f"the JSON nests deeper than {DEPTH_MAX} levels")


def _strings_encodable(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return False
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


def _strict_decode(raw: bytes) -> Any:
    """Return the JSON value of ``raw``, or raise 400 :class:`MalformedBody` saying why."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MalformedBody(f"the body is not UTF-8 (byte {e.start})") from None
    try:
        value = _DECODER.decode(text)
    except json.JSONDecodeError as e:
        raise MalformedBody(
            f"the body is not JSON: {e.msg} at line {e.lineno} column {e.colno}"
        ) from None
    except RecursionError:  # an invalid text that the structure check could not measure
        raise MalformedBody(f"the JSON nests deeper than {DEPTH_MAX} levels") from None
    except ValueError as e:  # Python's bound on the digits of an integer
        raise MalformedBody(f"the body is not usable JSON: {e}") from None
    if _SURROGATE_ESCAPE.search(text) and not _strings_encodable(value):
        raise MalformedBody("the JSON holds a lone UTF-16 surrogate (\\uD800-\\uDFFF)")
    return value


#: Every digit as ``0``, every other byte as a space: a text's runs of digits, found by one
#: ``translate`` and one substring search (a regular expression costs several times more).
_DIGITS_AS_ZEROS = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
#: A run of 19 digits: an integer orjson would read as a float (past 64 bits), or a long
#: mantissa; either is left to the strict reader.
_LONG_DIGITS = b"0" * 19


def json_decode(raw: bytes) -> Any:
    """Return the JSON value of ``raw``, or raise 400 :class:`MalformedBody` saying why.

    A text with more brackets than :data:`DEPTH_MAX`, or more commas and brackets than
    :data:`VALUES_MAX`, has its structure measured first (:func:`_structure_check`). Then
    orjson reads the usual body, in C. It refuses everything the strict reader refuses
    except two things, which are checked or sent to the strict reader instead:

    * **a repeated key** (orjson keeps the last): every key of the text is followed by a
      colon, and so is every key orjson kept when written back, colons inside strings
      being the same on both sides; so with as many colons written back as read, no key
      was dropped. (``\\u003a``, an escaped colon, would break the count: such a text is
      left to the strict reader.)
    * **integers past 64 bits** (read as floats): a text with a run of 19 digits goes to
      the strict reader.

    Anything orjson refuses is read again by the strict reader, which says why (or accepts
    what only Python reads, such as ``1e400``), so the answers are the strict reader's.
    """
    containers = raw.count(b"[") + raw.count(b"{")
    if containers > DEPTH_MAX or containers + raw.count(b",") > VALUES_MAX:
        _structure_check(raw)
    if b"\\u003" not in raw and _LONG_DIGITS not in raw.translate(_DIGITS_AS_ZEROS):
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
        else:
            if orjson.dumps(value).count(b":") == raw.count(b":"):
                return value
    return _strict_decode(raw)


async def json_body_read(
    raw: bytes, content_type: str | None, accepted: Sequence[str] = (JSON,)
) -> Any:
    """Return the JSON value of a non-empty body: 415 for its media type, else 400 for it.

    A body over :data:`OFF_LOOP_BYTES` is decoded in a worker thread.
    """
    media_type_check(content_type, accepted)
    if len(raw) > OFF_LOOP_BYTES:
        return await asyncio.to_thread(json_decode, raw)
    return json_decode(raw)


def _accepted_types(route: APIRoute) -> tuple[str, ...]:
    declared = (route.openapi_extra or {}).get("requestBody", {}).get("content", {})
    return tuple(declared) or (JSON,)


def _query_names(dependant: Dependant) -> frozenset[str]:
    """Return the names of every query parameter ``dependant`` and its dependencies read."""
    names = {field.alias for field in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return frozenset(names)


def query_names_check(query_string: bytes, declared: frozenset[str]) -> None:
    """Raise the 422 of every query parameter name that is not in ``declared``, or that is
    given more than once (every Berth query parameter takes one value)."""
    if not query_string:
        return
    names = [name for name, _ in parse_qsl(query_string.decode("latin-1"),
                                           keep_blank_values=True)]
    unknown = sorted(set(names) - declared)
    repeated = sorted({name for name in names if names.count(name) > 1} & declared)
    errors = [
        {"type": "extra_forbidden", "loc": ("query", name),
         "msg": "Unknown query parameter" + (
             f"; this operation takes {', '.join(sorted(declared))}" if declared else
             "; this operation takes none"),
         "input": None}
        for name in unknown
    ] + [
        {"type": "too_long", "loc": ("query", name),
         "msg": "Given more than once; this parameter takes one value", "input": None}
        for name in repeated
    ]
    if errors:
        raise RequestValidationError(errors)


class StrictRoute(APIRoute):
    """A route that refuses unknown query parameters and reads a declared body with
    :func:`json_body_read` first."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """Return FastAPI's handler, preceded by the strict checks."""
        handler = super().get_route_handler()
        declared = _query_names(self.dependant)
        accepted = _accepted_types(self) if self.body_field is not None else None

        async def strict_handler(request: Request) -> Response:
            query_names_check(request.scope["query_string"], declared)
            if accepted is not None:
                raw = await request.body()
                if raw:
                    value = await json_body_read(
                        raw, request.headers.get("content-type"), accepted
                    )
                    # Starlette's Request caches its decoded JSON here; FastAPI reads the
                    # body through request.json() and so validates this value, decoded once.
                    request._json = value
            return await handler(request)

        return strict_handler

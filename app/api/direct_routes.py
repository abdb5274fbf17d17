"""Direct routes: endpoints that read their request themselves, with FastAPI's exact answers.

The hot routes (createTask, getTask) skip FastAPI's dependency resolution (for the key, the
role, each header and the body), which is most of the work of a task submit or read: they
take only the ``Request`` and use these functions instead. They give the same answers, in
the same order, as the ``Depends`` routes would:

1. the key was verified by the front door (:mod:`app.api.front_door`: 401) before any of
   the body was read;
2. the body is read strictly, as every route with a body reads it (:mod:`app.api.bodies`):
   another media type is 415 and a body that is not JSON 400;
3. the role is checked (:func:`app.auth.role_check`: 403);
4. path and header parameters, then the body, are validated; every error is reported in one
   422, with FastAPI's ``loc`` and messages.

The plain case pays one JSON decode, one strict ``model_validate`` and a few header lookups.
The contract for the OpenAPI document is declared with ``openapi_extra`` (see
:func:`header_parameter`).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any, TypeVar

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field, TypeAdapter, ValidationError
from starlette.requests import ClientDisconnect

from app.api.bodies import json_body_read, query_names_check
from app.auth import header_get

__all__ = [
    "Body",
    "DirectRoute",
    "body_read",
    "body_validate",
    "header_parameter",
    "path_parameter",
    "string_read",
    "validation_raise",
]

M = TypeVar("M", bound=BaseModel)

class DirectRoute(APIRoute):
    """A route whose endpoint takes only the ``Request`` and reads it itself.

    FastAPI's request handler (dependency solving, response-model validation, its telemetry
    hooks) is skipped: the endpoint is the handler, behind the same strict query check as
    every other route (:class:`app.api.bodies.StrictRoute`). The route is otherwise an
    ordinary ``APIRoute``: matched, documented (through ``openapi_extra``) and labelled in
    metrics like the others.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """Return the endpoint itself, preceded by the query check (it takes no query)."""
        endpoint = self.endpoint

        async def direct_handler(request: Request) -> Response:
            query_names_check(request.scope["query_string"], frozenset())
            return await endpoint(request)

        return direct_handler


class Body:
    """A request body as read: the model when it validated, else its errors (or none sent)."""

    __slots__ = ("errors", "model")

    def __init__(self, model: BaseModel | None, errors: list[Any] | None = None) -> None:
        self.model = model
        self.errors = errors


async def _body_receive(request: Request) -> bytes:
    """Return the whole request body, read from the ASGI ``receive`` channel.

    ``Request.body()`` reads through an async generator (``Request.stream()``); this loop
    does without it, which costs less on the hot routes. Nothing reads the body after it.
    """
    chunks = []
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def body_read(request: Request, model: type[M]) -> Body:
    """Read the body strictly (:mod:`app.api.bodies`) and validate it as ``model``.

    Raises the 415 of a body that is not ``application/json`` and the 400 of one that is not
    JSON (the key was verified before, by the front door); schema errors wait in the
    ``Body``.
    """
    raw = await _body_receive(request)
    if not raw:
        return Body(None)
    value = await json_body_read(raw, header_get(request, b"content-type"))
    try:
        return Body(model.model_validate(value))
    except ValidationError:
        pass
    try:
        # Validated again as FastAPI validates (from_attributes), for the same verdict and
        # messages; only an invalid body is validated twice.
        return Body(model.model_validate(value, from_attributes=True))
    except ValidationError as e:
        return Body(None, e.errors(include_url=False))


def _located(errors: list[Any], prefix: tuple[Any, ...]) -> list[dict[str, Any]]:
    return [{**e, "loc": prefix + tuple(e["loc"])} for e in errors]


def body_validate(body: Body, model: type[M], errors: list[dict[str, Any]]) -> M | None:
    """Return the body as ``model``, or add its validation errors to ``errors``."""
    if body.model is not None:
        return body.model  # type: ignore[return-value]
    if body.errors is None:
        errors.append({"type": "missing", "loc": ("body",), "msg": "Field required",
                       "input": None})
        return None
    errors.extend(_located(body.errors, ("body",)))
    return None


_ADAPTERS: dict[tuple[int, int], TypeAdapter[str]] = {}


def string_read(
    value: str | None,
    where: tuple[str, str],
    errors: list[dict[str, Any]],
    *,
    min_length: int = 0,
    max_length: int,
) -> str | None:
    """Return ``value`` when its length is within bounds, else add pydantic's error."""
    if value is None or min_length <= len(value) <= max_length:
        return value
    adapter = _ADAPTERS.get((min_length, max_length))
    if adapter is None:
        adapter = TypeAdapter(Annotated[str, Field(min_length=min_length, max_length=max_length)])
        _ADAPTERS[(min_length, max_length)] = adapter
    try:
        adapter.validate_python(value)
    except ValidationError as e:
        errors.extend(_located(e.errors(include_url=False), where))
    return None


def validation_raise(errors: list[dict[str, Any]]) -> None:
    """Raise the one 422 of ``errors``, if any."""
    if errors:
        raise RequestValidationError(errors)


def header_parameter(
    name: str, description: str, *, min_length: int | None = None, max_length: int
) -> dict[str, Any]:
    """Return the OpenAPI declaration of an optional string header (as FastAPI writes it)."""
    string: dict[str, Any] = {"type": "string"}
    if min_length is not None:
        string["minLength"] = min_length
    string["maxLength"] = max_length
    return {
        "name": name,
        "in": "header",
        "required": False,
        "schema": {
            "anyOf": [string, {"type": "null"}],
            "description": description,
            "title": name,
        },
        "description": description,
    }


def path_parameter(name: str, description: str) -> dict[str, Any]:
    """Return the OpenAPI declaration of a string path parameter (as FastAPI writes it)."""
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": {
            "type": "string",
            "description": description,
            "title": name.capitalize(),
        },
        "description": description,
    }

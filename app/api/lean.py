"""Lean routes: the hot endpoints read their request themselves, with FastAPI's exact answers.

FastAPI's generic machinery (dependency resolution for the key, the role, each header and
the body) costs about three times the work of a task submit or read. The hot routes
(createTask, getTask) take only the ``Request`` and use these functions instead; they give
the same answers, in the same order, as the ``Depends`` routes would:

1. the body is read and decoded as JSON (not JSON: 422 ``json_invalid`` before anything else;
   undecodable: 400), exactly as FastAPI does;
2. the key and role are checked (:func:`app.auth.principal_from_request`: 401, 403);
3. path and header parameters, then the body, are validated; every error is reported in one
   422, with FastAPI's ``loc`` and messages.

The plain case pays one ``model_validate_json`` and a few header lookups. The contract for
the OpenAPI document is declared with ``openapi_extra`` (see :func:`header_parameter`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, TypeVar

from fastapi import HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field, TypeAdapter, ValidationError

__all__ = [
    "Body",
    "body_read",
    "body_validate",
    "header_parameter",
    "path_parameter",
    "string_read",
    "validation_raise",
]

M = TypeVar("M", bound=BaseModel)

#: No body at all (FastAPI's ``Undefined``): the body field is missing.
_MISSING: Any = object()


class Body:
    """A request body as read: the model when it validated at once, else the value to check."""

    __slots__ = ("model", "value")

    def __init__(self, model: BaseModel | None, value: Any = _MISSING) -> None:
        self.model = model
        self.value = value


def _json_content(content_type: str | None) -> bool:
    """Return whether FastAPI would decode a body of ``content_type`` as JSON
    (``application/json`` or ``application/*+json``, parameters and case aside)."""
    if not content_type:
        return False  # FastAPI's strict content type: no header, no JSON
    media = content_type.partition(";")[0].strip().lower()
    maintype, _, subtype = media.partition("/")
    return maintype == "application" and (subtype == "json" or subtype.endswith("+json"))


async def body_read(request: Request, model: type[M]) -> Body:
    """Read the body: validated as ``model`` in the plain case, else decoded as FastAPI does.

    Raises the 422 of a body that is not JSON and the 400 of one that cannot be decoded,
    before the key is checked (FastAPI's order).
    """
    raw = await request.body()
    if not raw:
        return Body(None)
    if not _json_content(request.headers.get("content-type")):
        return Body(None, raw)
    try:
        return Body(model.model_validate_json(raw))
    except ValidationError:
        pass  # the slow path below gives FastAPI's exact errors
    try:
        return Body(None, json.loads(raw))
    except json.JSONDecodeError as e:
        raise RequestValidationError(
            [
                {
                    "type": "json_invalid",
                    "loc": ("body", e.pos),
                    "msg": "JSON decode error",
                    "input": {},
                    "ctx": {"error": e.msg},
                }
            ],
            body=e.doc,
        ) from e
    except Exception as e:
        raise HTTPException(status_code=400, detail="There was an error parsing the body") from e


def _located(errors: list[Any], prefix: tuple[Any, ...]) -> list[dict[str, Any]]:
    return [{**e, "loc": prefix + tuple(e["loc"])} for e in errors]


def body_validate(body: Body, model: type[M], errors: list[dict[str, Any]]) -> M | None:
    """Return the body as ``model``, or add its validation errors to ``errors``."""
    if body.model is not None:
        return body.model  # type: ignore[return-value]
    if body.value is _MISSING:
        errors.append({"type": "missing", "loc": ("body",), "msg": "Field required",
                       "input": None})
        return None
    try:
        return model.model_validate(body.value, from_attributes=True)
    except ValidationError as e:
        errors.extend(_located(e.errors(include_url=False), ("body",)))
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


def path_parameter(name: str, description: str, *, max_length: int) -> dict[str, Any]:
    """Return the OpenAPI declaration of a string path parameter (as FastAPI writes it)."""
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": {
            "type": "string",
            "maxLength": max_length,
            "description": description,
            "title": name.capitalize(),
        },
        "description": description,
    }

"""The problem+json error base (RFC 9457) and the configuration error.

Every error the API can answer with is a subclass of :class:`BerthError`; its class
attributes give the status and title and its docstring is the default detail. One handler
in :mod:`app.api.problems` renders them all.
"""

from __future__ import annotations

from typing import Any, ClassVar


class ConfigurationError(Exception):
    """Berth is configured wrongly; the message says what to fix, in one line."""


class BerthError(Exception):
    """Something went wrong."""

    status: ClassVar[int] = 500
    title: ClassVar[str] = "Internal Server Error"
    type_slug: ClassVar[str] = "internal"

    def __init__(self, detail: str | None = None, *, extra: dict[str, Any] | None = None) -> None:
        self.detail = detail or (self.__doc__ or self.title).strip()
        self.extra = extra or {}
        super().__init__(self.detail)

    @property
    def type_uri(self) -> str:
        """Return the problem type URI of this error."""
        return f"https://berth.dev/problems/{self.type_slug}"


class BadRequest(BerthError):
    """The request is malformed."""

    status = 400
    title = "Bad Request"
    type_slug = "bad-request"


class Unauthorized(BerthError):
    """A valid API key is required: send `Authorization: Bearer <key>`."""

    status = 401
    title = "Unauthorized"
    type_slug = "unauthorized"


class Forbidden(BerthError):
    """This key's role may not perform this operation."""

    status = 403
    title = "Forbidden"
    type_slug = "forbidden"


class NotFound(BerthError):
    """The resource does not exist."""

    status = 404
    title = "Not Found"
    type_slug = "not-found"


class Conflict(BerthError):
    """The request conflicts with the current state of the resource."""

    status = 409
    title = "Conflict"
    type_slug = "conflict"


class PreconditionFailed(BerthError):
    """The resource changed since the ETag given in If-Match."""

    status = 412
    title = "Precondition Failed"
    type_slug = "precondition-failed"


class PayloadTooLarge(BerthError):
    """The request body is larger than the configured limit."""

    status = 413
    title = "Payload Too Large"
    type_slug = "payload-too-large"


class Unprocessable(BerthError):
    """The request is well-formed but its content is invalid."""

    status = 422
    title = "Unprocessable Content"
    type_slug = "validation"


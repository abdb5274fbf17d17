"""The OpenAPI document: FastAPI's, completed for generated clients and contract tests.

On top of what FastAPI derives from the routes this adds the ``Problem`` schema (RFC 9457)
and declares every error as ``application/problem+json`` (FastAPI's own 422 schema is
replaced, since Berth never answers with it), the bearer security scheme, tag descriptions
and servers; every operation declares what the HTTP layer may answer (408, 429, 431, 503),
every secured one 401 and 403, every one with a body 400 (not JSON), 413, 415 (not
``application/json``) and 422. Regenerate the committed copy with::

    berth openapi --output docs/openapi.json
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from app.api.common import BODY_STATUSES, HTTP_LAYER_STATUSES, PROBLEM, problems

SECURITY_SCHEME = "HTTPBearer"

TAGS: list[dict[str, str]] = [
    {
        "name": "pools",
        "description": "Runtime pools: where work can run. Admins create and change them and "
        "register their capacity ledger; every caller sees the pools visible to it.",
    },
    {
        "name": "operators",
        "description": "Pool status actions (cordon, drain, activate) for the operators a "
        "pool lists.",
    },
    {
        "name": "tasks",
        "description": "Tenants submit tasks and read their state, placement explanation, "
        "lease and history. Another tenant's task is always 404.",
    },
    {
        "name": "placements",
        "description": "Dry-run placement on the live snapshot: ranked candidates with "
        "score components and rejections; reserves nothing.",
    },
    {
        "name": "queue",
        "description": "What is pending and why: waiting tasks by runtime class and reason "
        "code, scoped to the caller (a tenant its own, an operator its pools' demand).",
    },
    {
        "name": "runtimes",
        "description": "Runtime instances: heartbeats (health and lease renewal) and the "
        "leases granted to them.",
    },
    {
        "name": "leases",
        "description": "Leases held by runtimes: completion releases the reserved capacity.",
    },
    {
        "name": "keys",
        "description": "API keys (admin only): list, create (the secret is shown once) and "
        "revoke.",
    },
    {
        "name": "tenants",
        "description": "Tenants' cohorts, fair weights and quotas (admin writes; a tenant key "
        "reads its own), with usage per runtime class.",
    },
    {
        "name": "cohorts",
        "description": "The quota tree's cohorts: parent, fair weight and quotas of their own "
        "(admin writes; a tenant key reads those on its path to the root), with usage.",
    },
    {
        "name": "watch",
        "description": "The changes a key may see, after a cursor: Server-Sent Events or a "
        "long poll, resumable, in commit order, with `410 Gone` for a cursor older than the "
        "history.",
    },
    {
        "name": "replays",
        "description": "Recorded passes planned again with this build's planner and compared "
        "with what was committed, optionally under another profile (admin only).",
    },
    {"name": "health", "description": "Liveness and readiness probes (no key needed)."},
]

SERVERS = [{"url": "http://127.0.0.1:8000", "description": "`berth serve` with its defaults"}]

DESCRIPTION = """\
Berth places tasks on runtime pools and holds their capacity in a durable ledger. Every
decision is explainable: a task shows its placement (score components and ranked
alternatives) or why it is pending; `previewPlacement` shows the same for a spec without
submitting it.

**Auth**: `Authorization: Bearer <key>`. A key has one role — `admin`, `operator`,
`tenant` or `runtime` — and the tenants or runtime instances it acts for. A tenant key
acting for several tenants names one in `X-Berth-Tenant` when it submits.

**Bodies** are `application/json` in UTF-8 (`updatePool` also takes
`application/merge-patch+json`): another media type is 415; a body that is not JSON — a
syntax error, bytes that are not UTF-8, a repeated object key, nesting deeper than 64 — is
400; a body against the schema is 422. **Types are strict**: where the schema says integer,
`"500"`, `500.0` and `true` are 422, never converted; names are camelCase only (an unknown
or snake_case name is 422). A path id that cannot exist is 404.

**Timestamps** in every answer are RFC 3339 in UTC with a `Z`.

**Errors** are RFC 9457 `application/problem+json` (`type`, `title`, `status`, `detail`,
and `errors` [{`loc`, `msg`}] for validation). Besides its own, any operation may answer
408 (request not received in time), 429 (the key's rate limit, with `Retry-After`), 431
(request head too large) and 503 (overloaded or database unreachable, with `Retry-After`).
Lists are cursor-paginated: pass the `nextCursor` of a page as `cursor` for the next one.
"""

PROBLEM_SCHEMA: dict[str, Any] = {
    "title": "Problem",
    "type": "object",
    "description": "An RFC 9457 problem: every error answer of the API has this shape.",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {
            "type": "string",
            "description": "A URI naming the kind of problem.",
            "examples": ["https://berth.dev/problems/validation"],
        },
        "title": {"type": "string", "description": "Short summary of the kind of problem."},
        "status": {"type": "integer", "description": "The HTTP status code."},
        "detail": {"type": "string", "description": "What went wrong, for a human."},
        "errors": {
            "type": "array",
            "description": "Validation errors, one per invalid field.",
            "items": {
                "type": "object",
                "required": ["loc", "msg"],
                "properties": {
                    "loc": {
                        "type": "array",
                        "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                        "description": "Where: e.g. [\"body\", \"requests\", \"cpuMillis\"].",
                    },
                    "msg": {"type": "string"},
                },
            },
        },
        "requestId": {
            "type": "string",
            "description": "Set on 500: the id the error was logged with.",
        },
    },
    "additionalProperties": True,
    "examples": [
        {
            "type": "https://berth.dev/problems/validation",
            "title": "Unprocessable Content",
            "status": 422,
            "detail": "body.requests.cpuMillis: Input should be greater than or equal to 0",
            "errors": [
                {
                    "loc": ["body", "requests", "cpuMillis"],
                    "msg": "Input should be greater than or equal to 0",
                }
            ],
        }
    ],
}

_METHODS = ("get", "put", "post", "delete", "patch")


def _fastapi_default_422(response: dict[str, Any]) -> bool:
    schema = response.get("content", {}).get("application/json", {}).get("schema", {})
    return schema.get("$ref", "").endswith("/HTTPValidationError")


def _complete_operation(op: dict[str, Any]) -> None:
    responses = op.setdefault("responses", {})
    wanted: list[int] = list(HTTP_LAYER_STATUSES)
    if op.get("security"):
        wanted += [401, 403]
    if "requestBody" in op:
        wanted += BODY_STATUSES
    if op.get("security") or any(
        p.get("in") in ("query", "header") for p in op.get("parameters", ())
    ):
        wanted.append(422)  # every v1 operation: an unknown query parameter is 422
    elif 422 not in wanted and _fastapi_default_422(responses.get("422", {})):
        # FastAPI declares 422 for any parameter; the probes take none that can be wrong.
        del responses["422"]
    declarations = problems(*wanted)
    for status, declaration in declarations.items():
        responses.setdefault(str(status), declaration)
    for status, response in responses.items():
        if status.startswith(("4", "5")):
            # FastAPI declares its default 422 as application/json HTTPValidationError;
            # Berth answers every error as a Problem, with the standard description.
            response["content"] = PROBLEM["content"]
            if int(status) in declarations:
                response.update(declarations[int(status)])
    op["responses"] = dict(sorted(responses.items()))


def openapi_build(app: FastAPI) -> dict[str, Any]:
    """Return the completed OpenAPI document of ``app``."""
    doc = get_openapi(
        title=app.title,
        version=app.version,
        summary=app.summary,
        description=DESCRIPTION,
        routes=app.routes,
        tags=TAGS,
        servers=SERVERS,
    )
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas["Problem"] = PROBLEM_SCHEMA
    scheme = components.setdefault("securitySchemes", {}).setdefault(
        SECURITY_SCHEME, {"type": "http", "scheme": "bearer"}
    )
    scheme["bearerFormat"] = "berth API key"
    for path in doc.get("paths", {}).values():
        for method in _METHODS:
            if method in path:
                _complete_operation(path[method])
    doc["components"]["schemas"] = dict(sorted(schemas.items()))
    return doc


def openapi_install(app: FastAPI) -> None:
    """Make ``app`` serve the completed document at /openapi.json (built once, then cached)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = openapi_build(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def openapi_render(doc: dict[str, Any]) -> str:
    """Return ``doc`` as the committed text: indented JSON with a final newline."""
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"

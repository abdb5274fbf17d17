"""The OpenAPI document: committed copy up to date, operation ids, tags, declared problems."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.api.openapi import openapi_render
from app.document import openapi_document

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
METHODS = ("get", "put", "post", "delete", "patch")


@pytest.fixture(scope="module")
def doc() -> dict:
    return openapi_document()


def operations(doc: dict) -> list[tuple[str, str, dict]]:
    return [
        (method.upper(), path, op)
        for path, item in doc["paths"].items()
        for method, op in item.items()
        if method in METHODS
    ]


def test_committed_document_is_up_to_date(doc):
    assert COMMITTED.read_text() == openapi_render(doc), (
        "docs/openapi.json is out of date: run `berth openapi --output docs/openapi.json`"
    )


def test_every_operation_has_a_unique_operation_id_and_known_tags(doc):
    declared_tags = {t["name"] for t in doc["tags"]}
    ids = []
    for method, path, op in operations(doc):
        assert op.get("operationId"), f"{method} {path} has no operationId"
        assert op["operationId"][0].islower() and "_" not in op["operationId"], op["operationId"]
        assert op.get("tags"), f"{method} {path} has no tags"
        assert set(op["tags"]) <= declared_tags, (method, path, op["tags"])
        assert op.get("summary") and op.get("description"), f"{method} {path} is undocumented"
        ids.append(op["operationId"])
    assert len(ids) == len(set(ids))


def test_task_and_placement_operations_are_named_for_clients(doc):
    named = {op["operationId"]: (method, path) for method, path, op in operations(doc)}
    assert named["createTask"] == ("POST", "/v1/tasks")
    assert named["listTasks"] == ("GET", "/v1/tasks")
    assert named["getTask"] == ("GET", "/v1/tasks/{taskId}")
    assert named["listTaskEvents"] == ("GET", "/v1/tasks/{taskId}/events")
    assert named["cancelTask"] == ("POST", "/v1/tasks/{taskId}/cancel")
    assert named["previewPlacement"] == ("POST", "/v1/placements/preview")


def test_errors_are_declared_as_problems(doc):
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    problem = doc["components"]["schemas"]["Problem"]
    assert set(problem["required"]) == {"type", "title", "status", "detail"}
    for method, path, op in operations(doc):
        responses = op["responses"]
        for status, response in responses.items():
            if status.startswith(("4", "5")):
                assert list(response["content"]) == ["application/problem+json"], (
                    method, path, status)
                schema = response["content"]["application/problem+json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/Problem"}
        if op.get("security"):
            assert {"401", "403"} <= set(responses), (method, path)
        if "requestBody" in op:
            assert {"413", "422"} <= set(responses), (method, path)


def test_security_scheme_is_bearer_and_only_probes_are_open(doc):
    schemes = doc["components"]["securitySchemes"]
    assert schemes["HTTPBearer"]["type"] == "http"
    assert schemes["HTTPBearer"]["scheme"] == "bearer"
    open_ops = {path for _, path, op in operations(doc) if not op.get("security")}
    assert open_ops == {"/healthz", "/readyz"}


def test_task_shape_matches_spec(doc):
    task = doc["components"]["schemas"]["Task"]
    assert {"id", "tenantId", "state", "spec", "priority", "attempts", "createdAt",
            "pendingReason", "placement", "lease"} <= set(task["properties"])
    placement = doc["components"]["schemas"]["Placement"]
    assert set(placement["properties"]) == {"poolId", "score", "components", "members",
                                            "alternatives"}
    preview = doc["components"]["schemas"]["PlacementPreview"]
    assert set(preview["properties"]) == {"placement", "candidates", "rejected", "reason",
                                          "candidateCount", "rejectedCount",
                                          "rejectedByReason", "preemption", "nextCursor"}


async def test_the_app_serves_the_same_document(client, doc):
    r = await client.get("/openapi.json")
    assert r.status_code == 200
    assert r.json() == doc

"""Property-based contract test: schemathesis drives every operation of the committed
OpenAPI document against a live server and checks that no answer is a 5xx and that every
answer conforms to the document (status code, content type, headers, body schema)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis import checks as st_checks
from schemathesis.specs.openapi import checks as oa_checks

from tests.api.live import live_server

OPENAPI = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"

pytestmark = pytest.mark.slow

#: Generated examples per operation: enough to reach the documented branches of the
#: validation, few enough that the whole run stays well under a minute.
EXAMPLES = 30

CHECKS = [
    st_checks.not_a_server_error,
    oa_checks.status_code_conformance,
    oa_checks.content_type_conformance,
    oa_checks.response_headers_conformance,
    oa_checks.response_schema_conformance,
    # A request the document rules out (a string for an integer, a missing field, an unknown
    # one) must be refused with a 4xx, never accepted: the strict types, checked by fuzzing.
    oa_checks.negative_data_rejection,
]


def key_for(path: str, raw: dict[str, str]) -> str:
    """Return the key of the role an operation belongs to, so that calls get past auth."""
    if path.startswith(("/v1/tasks", "/v1/task-batches", "/v1/placements")):
        return raw["tenant_a"]
    if path.startswith(("/v1/runtimes", "/v1/leases")):
        return raw["runtime_1"]
    return raw["admin"]


#: Operations that answer a schema-violating *item* inside a 200 (one bad item of
#: a batch does not reject the others). Instead of the generic rejection check, a 200 to a
#: request the document rules out must give some item a 4xx (:func:`_bad_item_answered`).
ITEMWISE = frozenset({"createTaskBatch"})


def _bad_item_answered(case, response) -> None:
    if response.status_code == 200:
        statuses = [item["status"] for item in response.json()["items"]]
        assert any(400 <= s < 500 for s in statuses), f"a bad batch was stored: {statuses}"


def _runner(
    operation, base_url: str, headers: dict[str, str], calls: list[int], mode: GenerationMode
) -> Callable:
    """Return a hypothesis test that calls ``operation`` and validates every answer."""
    itemwise = (mode == GenerationMode.NEGATIVE
                and operation.definition.raw.get("operationId") in ITEMWISE)
    checks = [c for c in CHECKS if c is not oa_checks.negative_data_rejection or not itemwise]

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case) -> None:
        calls.append(1)
        response = case.call(base_url=base_url, headers=headers, timeout=30)
        try:
            case.validate_response(response, checks=checks, headers=headers)
            if itemwise:
                _bad_item_answered(case, response)
        except (Exception, BaseExceptionGroup) as exc:  # schemathesis raises a group
            raise AssertionError(
                f"{exc}\n  request: {case.as_curl_command(headers=headers)}\n"
                f"  answer: {response.status_code} {response.text[:500]}"
            ) from None

    return run


def _fuzz(base_url: str, raw_keys: dict[str, str]) -> tuple[list[str], int]:
    schema = schemathesis.openapi.from_dict(json.loads(OPENAPI.read_text()))
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15
    failures: list[str] = []
    calls: list[int] = []
    for operation in operations:
        headers = {"Authorization": f"Bearer {key_for(operation.path, raw_keys)}"}
        modes = [GenerationMode.POSITIVE]
        if operation.body or any(True for _ in operation.iter_parameters()):
            modes.append(GenerationMode.NEGATIVE)  # there is something to get wrong
        for mode in modes:
            try:
                _runner(operation, base_url, headers, calls, mode)()
            except (Exception, BaseExceptionGroup) as exc:  # record it; fuzz the others
                failures.append(f"{operation.method.upper()} {operation.path} ({mode}): {exc}")
    return failures, len(calls)


async def test_no_server_errors_and_every_answer_matches_the_document(keys, database_url):
    with live_server(database_url) as base_url:
        failures, calls = await asyncio.to_thread(_fuzz, base_url, keys.raw)
    assert not failures, "\n\n".join(failures)
    assert calls >= 10 * 15  # it really ran


async def test_a_nul_character_anywhere_is_422_not_500(client, keys):
    """The first finding of this fuzzing, pinned: PostgreSQL text cannot hold NUL."""
    pool = {"id": "p-nul", "tenantIds": ["tenant-a"], "runtimeClass": "gpu-small",
            "runtimeInstanceId": "rt-1", "region": "eu\x00west"}
    r = await client.post("/v1/pools", json=pool, headers=keys.admin)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")

"""Strict requests (SPEC §6): 415 for a body that is not JSON, 400 for one that cannot be
decoded, 422 for one against the schema — no coercion, camelCase only, no repeated keys —
and 404 for a path id that cannot exist; one timestamp format (RFC 3339, ``Z``) in answers.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI

from app.api.bodies import DEPTH_MAX, MalformedBody, json_decode
from app.config import SHARD_SLOTS
from app.pass_config import ReconcilerConfig
from app.reconciler.loop import Reconciler
from tests.api.conftest import Keys, PoolMaker, assert_problem, pool_body

SPEC: dict[str, Any] = {"runtimeClass": "gpu-small", "requests": {"cpuMillis": 500}}
CAPACITY = {"cpuMillis": 8000, "memoryMiB": 8192, "llmSlots": 4}
MALFORMED = "https://berth.dev/problems/malformed-body"
VALIDATION = "https://berth.dev/problems/validation"


def _bodies(pool_id: str) -> dict[str, tuple[str, str, str, dict[str, Any]]]:
    """Return, by operationId: method, path, key name and a valid body."""
    lease = uuid.uuid4()
    return {
        "createPool": ("POST", "/v1/pools", "admin", pool_body("p-new")),
        "updatePool": ("PATCH", f"/v1/pools/{pool_id}", "admin", {"ready": False}),
        "putPoolCapacity": ("PUT", f"/v1/pools/{pool_id}/capacity", "admin", CAPACITY),
        "drainPool": ("POST", f"/v1/pools/{pool_id}/drain", "admin", {"reason": "r"}),
        "createTask": ("POST", "/v1/tasks", "tenant_a", SPEC),
        "previewPlacement": ("POST", "/v1/placements/preview", "tenant_a", SPEC),
        "completeLease": ("POST", f"/v1/leases/{lease}/complete", "runtime_1",
                          {"outcome": "succeeded", "epoch": 1}),
    }


OPERATIONS = list(_bodies("p"))

# (operationId, body change, why) — each must be 422: the document says otherwise.
COERCIONS: list[tuple[str, dict[str, Any], str]] = [
    ("createTask", {"requests": {"cpuMillis": True}}, "bool for integer"),
    ("createTask", {"requests": {"cpuMillis": "500"}}, "string for integer"),
    ("createTask", {"requests": {"cpuMillis": 500.0}}, "float for integer"),
    ("createTask", {"priority": "1"}, "string for integer"),
    ("createTask", {"runtimeClass": 5}, "integer for string"),
    ("createTask", {"runtime_class": "gpu-small"}, "snake_case name"),
    ("createTask", {"maxAttempts": None}, "null for integer"),
    ("previewPlacement", {"requests": {"cpuMillis": "500"}}, "string for integer"),
    ("putPoolCapacity", {"cpuMillis": "8000"}, "string for integer"),
    ("putPoolCapacity", {"llmSlots": True}, "bool for integer"),
    ("putPoolCapacity", {"cpu_millis": 8000}, "snake_case name"),
    ("createPool", {"ready": "true"}, "string for boolean"),
    ("createPool", {"costWeight": "1.5"}, "string for number"),
    ("createPool", {"runtime_class": "gpu-small"}, "snake_case name"),
    ("updatePool", {"ready": 0}, "integer for boolean"),
    ("updatePool", {"cost_weight": 2.0}, "snake_case name"),
    ("drainPool", {"deadline": 1893456000}, "Unix time for date-time"),
    ("drainPool", {"deadline": "1893456000"}, "digits for date-time"),
    ("completeLease", {"epoch": "1"}, "string for integer"),
    ("completeLease", {"epoch": True}, "bool for integer"),
]


def _merged(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for name, value in change.items():
        if isinstance(value, dict) and isinstance(out.get(name), dict):
            out[name] = {**out[name], **value}
        else:
            out[name] = value
    return out


@pytest.fixture
async def ready(pool_make: PoolMaker) -> str:
    await pool_make("pool-s", capacity=CAPACITY)
    return "pool-s"


@pytest.mark.parametrize(("operation", "change", "why"), COERCIONS,
                         ids=[f"{o}-{w}" for o, _, w in COERCIONS])
async def test_no_coercion_and_camel_case_only(
    client: httpx.AsyncClient, keys: Keys, ready: str, operation: str,
    change: dict[str, Any], why: str,
) -> None:
    method, path, key, body = _bodies(ready)[operation]
    answer = await client.request(method, path, json=_merged(body, change), headers=keys[key])
    problem = assert_problem(answer, 422)
    assert problem["type"] == VALIDATION
    assert problem["errors"], problem
    if operation == "putPoolCapacity":
        pool = (await client.get(f"/v1/pools/{ready}", headers=keys.admin)).json()
        assert pool["capacity"] == CAPACITY, "nothing was stored"


async def test_the_valid_bodies_pass(client: httpx.AsyncClient, keys: Keys, ready: str) -> None:
    """The table's bodies are valid: each refusal above is about its one change."""
    for operation, (method, path, key, body) in _bodies(ready).items():
        answer = await client.request(method, path, json=body, headers=keys[key])
        expected = 404 if operation == "completeLease" else None  # no such lease: past 422
        assert answer.status_code < 300 or answer.status_code == expected, (operation, answer.text)


DEEP = b"[" * 10_000 + b"]" * 10_000
UNDECODABLE: list[tuple[bytes, str]] = [
    (b"{not json", "not JSON"),
    (b'{"a": 1,}', "not JSON"),
    (b"\xff\xfe{}", "not UTF-8"),
    (b'{"runtimeClass": "\xc3\x28"}', "not UTF-8"),
    (b'{"runtimeClass": "x", "runtimeClass": "y"}', "repeats the key"),
    (b'{"requests": {"cpuMillis": 1, "cpuMillis": 2}}', "repeats the key"),
    (DEEP, "deeper"),
    (b"[" * (DEPTH_MAX + 1) + b"]" * (DEPTH_MAX + 1), "deeper"),
    (b'{"requests": {"cpuMillis": ' + b"9" * 5000 + b"}}", "digits"),
    (b'{"requests": {"cpuMillis": NaN}}', "NaN"),
    (b'{"requests": {"cpuMillis": Infinity}}', "Infinity"),
    (b'{"runtimeClass": "\\ud800"}', "surrogate"),
    (b"\xef\xbb\xbf{}", "BOM"),
]


@pytest.mark.parametrize("operation", OPERATIONS)
async def test_an_undecodable_body_is_400_with_a_berth_type(
    client: httpx.AsyncClient, keys: Keys, ready: str, operation: str
) -> None:
    method, path, key, _ = _bodies(ready)[operation]
    headers = {**keys[key], "Content-Type": "application/json"}
    for content, why in UNDECODABLE:
        answer = await client.request(method, path, content=content, headers=headers)
        problem = assert_problem(answer, 400)
        assert problem["type"] == MALFORMED, (operation, why, problem)
        assert "about:blank" not in answer.text


@pytest.mark.parametrize("operation", OPERATIONS)
@pytest.mark.parametrize(
    "content_type",
    [None, "application/vnd.foo+json", "text/plain", "application/x-www-form-urlencoded",
     "application/json; charset=latin-1", "multipart/form-data; boundary=x"],
)
async def test_a_body_that_is_not_application_json_is_415(
    client: httpx.AsyncClient, keys: Keys, ready: str, operation: str, content_type: str | None
) -> None:
    method, path, key, body = _bodies(ready)[operation]
    headers = dict(keys[key])
    if content_type is not None:
        headers["Content-Type"] = content_type
    answer = await client.request(method, path, content=orjson.dumps(body), headers=headers)
    problem = assert_problem(answer, 415)
    assert problem["type"] == "https://berth.dev/problems/unsupported-media-type"
    assert "application/json" in problem["detail"], problem
    assert "application/json" in answer.headers["accept"]


async def test_merge_patch_is_accepted_where_documented(
    client: httpx.AsyncClient, keys: Keys, ready: str
) -> None:
    headers = {**keys.admin, "Content-Type": "application/merge-patch+json"}
    patched = await client.patch(f"/v1/pools/{ready}", content=b'{"ready": false}',
                                 headers=headers)
    assert patched.status_code == 200, patched.text
    elsewhere = await client.put(f"/v1/pools/{ready}/capacity", content=orjson.dumps(CAPACITY),
                                 headers=headers)
    assert_problem(elsewhere, 415)
    assert elsewhere.headers["accept"] == "application/json"
    refused = await client.patch(f"/v1/pools/{ready}", content=b'{"ready": false}',
                                 headers={**keys.admin, "Content-Type": "text/json"})
    assert set(assert_problem(refused, 415)["detail"].split("`")) >= {
        "application/json", "application/merge-patch+json"}


async def test_an_optional_body_may_be_absent_but_not_mistyped(
    client: httpx.AsyncClient, keys: Keys, ready: str
) -> None:
    empty = await client.post(f"/v1/pools/{ready}/cordon", headers=keys.admin)
    assert empty.status_code == 200, empty.text
    typed = await client.post(f"/v1/pools/{ready}/activate", content=b"reason=x",
                              headers={**keys.admin, "Content-Type": "text/plain"})
    assert_problem(typed, 415)


@pytest.mark.parametrize(
    ("method", "path", "key"),
    [
        ("GET", "/v1/pools/%00", "admin"),
        ("GET", "/v1/pools/Pool-X", "admin"),
        ("GET", "/v1/pools/" + "p" * 64, "tenant_a"),
        ("DELETE", "/v1/pools/%00", "admin"),
        ("PUT", "/v1/pools/%00/capacity", "admin"),
        ("POST", "/v1/pools/a%00b/cordon", "admin"),
        ("GET", "/v1/tasks/%00", "tenant_a"),
        ("GET", "/v1/tasks/" + "0" * 65, "tenant_a"),
        ("GET", "/v1/tasks/%00/events", "tenant_a"),
        ("POST", "/v1/tasks/not-a-task/cancel", "tenant_a"),
        ("POST", "/v1/leases/%00/complete", "runtime_1"),
    ],
)
async def test_an_impossible_path_id_is_404(
    client: httpx.AsyncClient, keys: Keys, method: str, path: str, key: str
) -> None:
    body = None
    if path.endswith("/capacity"):
        body = CAPACITY
    elif path.endswith("/complete"):
        body = {"outcome": "succeeded", "epoch": 1}
    answer = await client.request(method, path, json=body, headers=keys[key])
    assert_problem(answer, 404)


async def test_an_impossible_instance_id_is_403_like_any_other_instance(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    for instance in ("%00", "r" * 500):
        answer = await client.post(f"/v1/runtimes/{instance}/heartbeat", headers=keys.runtime_1)
        assert_problem(answer, 403)


def test_json_decode_refuses_what_json_does_not_mean() -> None:
    assert json_decode(b'{"a": [1, {"b": "\\ud83d\\ude00"}]}') == {"a": [1, {"b": "\U0001f600"}]}
    assert json_decode(b"[" * DEPTH_MAX + b"]" * DEPTH_MAX) is not None
    for raw in (DEEP, b'{"a":1,"a":1}', b"NaN", b"-Infinity", b"1" * 5000, b'"\\udfff"'):
        with pytest.raises(MalformedBody):
            json_decode(raw)



@pytest.mark.parametrize("raw", [
    b'{"a": 1, "a": 1}',  # a plain repeat
    b'{"a": {"x": 1}, "a": 2}',  # a repeat whose dropped value held keys of its own
    b'{"\\u0061": 1, "a": 2}',  # the same key, once escaped
    b'{"a": 1, "a": 2, "b": "\\u003a"}',  # an escaped colon where the dropped key's was
    b'{"a:": 1, "a:": 2, "b": ":"}',  # keys and values holding colons
])
def test_json_decode_refuses_a_repeated_key_however_written(raw: bytes) -> None:
    with pytest.raises(MalformedBody):
        json_decode(raw)


@pytest.mark.parametrize(("raw", "value"), [
    (b'{"image": "repo:tag", "at": "12:00:00", "k:v": " : "}',
     {"image": "repo:tag", "at": "12:00:00", "k:v": " : "}),
    (b'{"colon": "\\u003a"}', {"colon": ":"}),
    (b"[12345678901234567890, -9223372036854775809]", [12345678901234567890, -9223372036854775809]),
    (b"[1e400, 0.1, -0.0]", [float("inf"), 0.1, -0.0]),
])
def test_json_decode_reads_values_exactly_as_python_does(raw: bytes, value: Any) -> None:
    assert json_decode(raw) == value
    assert [type(v) for v in json_decode(raw)] == [type(v) for v in value]

# --- one timestamp format ---------------------------------------------------------------------

TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}")
RFC3339_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?Z$")


def _timestamps(value: Any, where: str = "") -> list[tuple[str, str]]:
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in _timestamps(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [t for i, v in enumerate(value) for t in _timestamps(v, f"{where}[{i}]")]
    if isinstance(value, str) and TIMESTAMP.match(value):
        return [(where, value)]
    return []


async def test_every_answer_writes_timestamps_rfc3339_utc_with_z(
    app: FastAPI, db, client: httpx.AsyncClient, keys: Keys, pool_make: PoolMaker
) -> None:
    await pool_make("pool-t", capacity=CAPACITY)
    answers: list[httpx.Response] = []

    async def call(method: str, path: str, key: str, **kwargs: Any) -> Any:
        answer = await client.request(method, path, headers=keys[key], **kwargs)
        assert answer.status_code < 300, (path, answer.text)
        answers.append(answer)
        return answer.json() if answer.content else None

    await call("POST", "/v1/runtimes/rt-1/heartbeat", "runtime_1")
    task = await call("POST", "/v1/tasks", "tenant_a", json=SPEC)
    reconciler = Reconciler(db, ReconcilerConfig.from_settings(app.state.settings),
                            owner_id="timestamps", slots=frozenset(range(SHARD_SLOTS)))
    assert (await reconciler.run_once(now=datetime.now(UTC))).leased == 1
    leased = await call("GET", f"/v1/tasks/{task['id']}", "tenant_a")
    await call("GET", "/v1/tasks", "tenant_a")
    await call("GET", "/v1/runtimes/rt-1/leases", "runtime_1")
    lease = leased["lease"]
    done = {"outcome": "succeeded", "epoch": lease["epoch"]}
    first = await client.post(f"/v1/leases/{lease['id']}/complete", json=done,
                              headers={**keys.runtime_1, "Idempotency-Key": "c-1"})
    replay = await client.post(f"/v1/leases/{lease['id']}/complete", json=done,
                               headers={**keys.runtime_1, "Idempotency-Key": "c-1"})
    answers += [first, replay]
    await call("GET", f"/v1/tasks/{task['id']}/events", "tenant_a")
    await call("GET", f"/v1/tasks/{task['id']}", "tenant_a")
    await call("POST", "/v1/pools/pool-t/drain", "admin",
               json={"deadline": "2030-01-01T13:00:00+01:00"})
    await call("GET", "/v1/pools", "admin")

    seen = [t for a in answers for t in _timestamps(a.json(), f"{a.request.url.path}")]
    names = {where.rsplit(".", 1)[-1].split("[")[0] for where, _ in seen}
    # Every kind of timestamp is in the sample: tasks, leases, events, pools, heartbeats.
    assert {"createdAt", "leasedAt", "finishedAt", "expiresAt", "at", "grantedAt",
            "lastHeartbeatAt", "drainDeadline"} <= names, names
    wrong = [(where, value) for where, value in seen if not RFC3339_UTC.match(value)]
    assert not wrong, wrong
    assert ("/v1/pools.items[0].drainDeadline", "2030-01-01T12:00:00Z") in seen


@pytest.mark.parametrize(
    ("path", "key", "query"),
    [
        ("/v1/tasks", "tenant_a", "runtime_class=gpu-small"),
        ("/v1/tasks", "tenant_a", "limit=5&stat=LEASED"),
        ("/v1/pools", "admin", "runtime_class=gpu-small"),
        ("/v1/pools/pool-s", "admin", "verbose=1"),
        # A fixed id: every xdist worker must collect the same test ids.
        ("/v1/tasks/6f1c1a52-3b8e-4c59-9d3e-2a7f0c4d5e61", "tenant_a", "x="),
    ],
)
async def test_an_unknown_query_parameter_is_422_not_ignored(
    client: httpx.AsyncClient, keys: Keys, ready: str, path: str, key: str, query: str
) -> None:
    answer = await client.get(f"{path}?{query}", headers=keys[key])
    problem = assert_problem(answer, 422)
    assert problem["errors"][0]["loc"][0] == "query", problem


@pytest.mark.parametrize(
    ("path", "key", "query"),
    [
        ("/v1/pools", "admin", "runtimeClass=a&runtimeClass=b"),
        ("/v1/tasks", "tenant_a", "limit=5&limit=6"),
    ],
)
async def test_a_query_parameter_given_twice_is_422_not_the_last_one_wins(
    client: httpx.AsyncClient, keys: Keys, ready: str, path: str, key: str, query: str
) -> None:
    answer = await client.get(f"{path}?{query}", headers=keys[key])
    problem = assert_problem(answer, 422)
    assert problem["errors"][0]["loc"][0] == "query", problem
    assert "more than once" in problem["errors"][0]["msg"], problem


async def test_the_declared_query_parameters_still_work(
    client: httpx.AsyncClient, keys: Keys, ready: str
) -> None:
    tasks = await client.get("/v1/tasks?runtimeClass=gpu-small&limit=5&state=ADMITTED",
                             headers=keys.tenant_a)
    pools = await client.get("/v1/pools?runtimeClass=gpu-small&limit=5&status=ACTIVE",
                             headers=keys.admin)
    assert (tasks.status_code, pools.status_code) == (200, 200), (tasks.text, pools.text)
    assert [p["id"] for p in pools.json()["items"]] == [ready]

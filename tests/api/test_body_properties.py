"""Property test of the body path: whatever bytes arrive as a body, the answer is a
documented 2xx or 4xx, never a 5xx.

Bodies are generated as JSON values of every shape (deep, wide, strange numbers and
strings), as the text of a valid spec cut and spliced, and as raw bytes, and are sent to
the operations that read a body, over a real socket.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.api.conftest import Keys
from tests.api.live import live_server

pytestmark = pytest.mark.slow

SPEC = {"runtimeClass": "gpu-small", "requests": {"cpuMillis": 500, "memoryMiB": 256},
        "labels": {"app": "web"}}
#: What an operation with a body may answer (docs/api.md, "Errors"); 404 for the pool that
#: does not exist, 409 for a repeated idempotency key.
DOCUMENTED = frozenset({200, 201, 400, 404, 409, 413, 415, 422, 429})

scalars = (st.none() | st.booleans() | st.integers() | st.integers(min_value=-(10**40),
                                                                    max_value=10**40)
           | st.floats(allow_nan=False) | st.text(max_size=20))
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=5),
    max_leaves=30,
)


def nested(depth: int, opener: bytes, closer: bytes, core: bytes) -> bytes:
    return opener * depth + core + closer * depth


deep = st.builds(
    nested,
    st.integers(min_value=0, max_value=2000),
    st.sampled_from([b"[", b'{"a":', b'{"spec":[']),
    st.sampled_from([b"]", b"}", b"]}"]),
    st.sampled_from([b"", b"1", b"{}", b'"x"', b"12345678901234567890"]),
)
spliced = st.builds(
    lambda text, at, cut, insert: text[:at] + insert + text[at + cut:],
    st.sampled_from([json.dumps(SPEC).encode(),
                     json.dumps({"items": [{"spec": SPEC}]}).encode()]),
    st.integers(min_value=0, max_value=120),
    st.integers(min_value=0, max_value=10),
    st.binary(max_size=8) | st.sampled_from([b'"', b"\\", b"\\u0000", b"\\ud800", b"NaN",
                                             b",", b":", b"[", b"}", b"1e999", b"\xff"]),
)
bodies = (values.map(lambda v: json.dumps(v).encode()) | deep | spliced | st.binary(max_size=64))

#: (method, path, key name, content type)
OPERATIONS = [
    ("POST", "/v1/tasks", "tenant_a", "application/json"),
    ("POST", "/v1/task-batches", "tenant_a", "application/json"),
    ("POST", "/v1/placements/preview", "tenant_a", "application/json"),
    ("POST", "/v1/pools", "admin", "application/json"),
    ("PATCH", "/v1/pools/pool-none", "admin", "application/merge-patch+json"),
    ("POST", "/v1/runtimes/rt-1/heartbeat", "runtime_1", "application/json"),
]


def _fuzz(base_url: str, raw_keys: dict[str, str]) -> list[str]:
    failures: list[str] = []
    with httpx.Client(base_url=base_url, timeout=30) as http:

        @settings(max_examples=150, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(body=bodies, operation=st.sampled_from(OPERATIONS))
        def run(body: bytes, operation: tuple[str, str, str, str]) -> None:
            method, path, key, media_type = operation
            answer = http.request(method, path, content=body, headers={
                "Authorization": f"Bearer {raw_keys[key]}", "Content-Type": media_type})
            if answer.status_code not in DOCUMENTED:
                failures.append(f"{method} {path} {body[:80]!r}: {answer.status_code} "
                                f"{answer.text[:200]}")
            assert answer.status_code < 500, failures[-1]
            if answer.status_code >= 400:
                assert answer.headers["content-type"].startswith("application/problem+json")

        run()
    return failures


async def test_every_body_is_answered_with_a_documented_2xx_or_4xx(
    keys: Keys, database_url: str
) -> None:
    with live_server(database_url) as base_url:
        failures = await asyncio.to_thread(_fuzz, base_url, keys.raw)
    assert not failures, "\n".join(failures)

"""A Python client generated from docs/openapi.json drives a real server end to end."""

from __future__ import annotations

import asyncio
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from openapi_python_client import generate
from openapi_python_client.config import Config, ConfigFile, MetaType
from openapi_python_client.parser.errors import ErrorLevel, GeneratorError, ParseError

from tests.api.live import live_server

OPENAPI = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"

pytestmark = pytest.mark.slow


def document_problems(errors: Sequence[GeneratorError]) -> list[GeneratorError]:
    """Return what the generator says about the document: parse problems and hard errors.

    Anything else it reports is about the machine it runs on (a formatter missing from
    PATH, say), not about what Berth publishes, and must not fail this test.
    """
    return [e for e in errors if isinstance(e, ParseError) or e.level is ErrorLevel.ERROR]


def test_document_problems_keep_parse_errors_and_ignore_the_environment() -> None:
    environment = GeneratorError(
        level=ErrorLevel.WARNING, header="Skipping Integration", detail="ruff is not in PATH"
    )
    document = ParseError(detail="schema Foo is invalid")
    fatal = GeneratorError(detail="Directory already exists.")

    assert document_problems([environment, document, fatal]) == [document, fatal]


@pytest.fixture(scope="module")
def generated_client(tmp_path_factory: pytest.TempPathFactory):
    """Generate the client package ``berth_client`` from the committed document and import it."""
    root = tmp_path_factory.mktemp("client")
    config = Config.from_sources(
        # No post-hooks: formatting the generated code (with ruff, if on PATH) changes nothing
        # a caller sees, and its absence is a warning about the machine, not the document.
        ConfigFile(post_hooks=[]),
        MetaType.NONE,
        OPENAPI,
        "utf-8",
        overwrite=False,
        output_path=root / "berth_client",
    )
    errors = generate(config=config)
    problems = document_problems(errors)
    assert not problems, "\n".join(f"{e.header}: {e.detail}" for e in problems)
    sys.path.insert(0, str(root))
    try:
        yield importlib.import_module("berth_client")
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m == "berth_client" or
                     m.startswith("berth_client.")]:
            del sys.modules[name]


def _use_client(berth_client, base_url: str, admin_key: str, tenant_key: str) -> None:
    from berth_client.api.placements import preview_placement
    from berth_client.api.pools import create_pool, put_pool_capacity
    from berth_client.api.tasks import create_task, get_task, list_tasks
    from berth_client.models import Capacity, PoolCreate, Problem, Resources, Task, TaskSpec

    admin = berth_client.AuthenticatedClient(base_url=base_url, token=admin_key)
    tenant = berth_client.AuthenticatedClient(base_url=base_url, token=tenant_key)

    pool = create_pool.sync_detailed(client=admin, body=PoolCreate.from_dict({
        "id": "gen-pool", "tenantIds": ["tenant-a"], "runtimeClass": "gpu-small",
        "runtimeInstanceId": "rt-1", "region": "eu-west",
    }))
    assert pool.status_code == 201, pool.content
    capacity = put_pool_capacity.sync_detailed(
        "gen-pool", client=admin,
        body=Capacity.from_dict({"cpuMillis": 4000, "memoryMiB": 8192, "llmSlots": 2}),
    )
    assert capacity.status_code == 200, capacity.content

    spec = TaskSpec(runtime_class="gpu-small",
                    requests=Resources.from_dict({"cpuMillis": 500, "memoryMiB": 512}))
    created = create_task.sync_detailed(client=tenant, body=spec, idempotency_key="gen-1")
    assert created.status_code == 201, created.content
    task = created.parsed
    assert isinstance(task, Task)
    assert task.state == "ADMITTED" and task.tenant_id == "tenant-a"

    again = create_task.sync_detailed(client=tenant, body=spec, idempotency_key="gen-1")
    assert again.status_code == 200 and again.parsed.id == task.id

    read = get_task.sync(str(task.id), client=tenant)
    assert isinstance(read, Task)
    assert read.id == task.id and read.spec.runtime_class == "gpu-small"
    assert read.spec.requests.cpu_millis == 500 and read.placement is None

    page = list_tasks.sync(client=tenant)
    assert [t.id for t in page.items] == [task.id]

    preview = preview_placement.sync(client=tenant, body=spec)
    # No heartbeat yet: the one visible pool is unhealthy, and the reason says so.
    assert preview.placement is None
    assert preview.reason.code == "runtime_unhealthy"
    assert [r.pool_id for r in preview.rejected] == ["gen-pool"]

    missing = get_task.sync_detailed("00000000-0000-0000-0000-000000000000", client=tenant)
    assert missing.status_code == 404
    assert isinstance(missing.parsed, Problem) and missing.parsed.status == 404


async def test_generated_client_creates_a_pool_submits_and_reads_back(
    generated_client, keys, database_url
):
    with live_server(database_url) as base_url:
        await asyncio.to_thread(
            _use_client, generated_client, base_url, keys.raw["admin"], keys.raw["tenant_a"]
        )

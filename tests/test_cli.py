"""`berth keys create`, `berth migrate` and one-line configuration errors."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest

from app.cli import main
from app.db import Database
from app.embedded import EmbeddedPostgres, postgres_processes
from app.ledger.keys import api_key_get
from app.schema import schema_current, schema_head
from tests.test_serve import (
    assert_one_line,
    berth_run,
    database_empty,
    key_role,
    port_free,
)


@pytest.fixture
def empty_database_url(server_url: str):  # type: ignore[no-untyped-def]
    """Yield the URL of a database on the test server that has no schema."""
    with database_empty(server_url) as url:
        yield url


@pytest.mark.slow
async def test_keys_create_prints_a_key_that_authenticates(
    db: Database, database_url: str, tmp_path: Path
) -> None:
    result = await asyncio.to_thread(
        berth_run,
        "keys", "create", "--role", "tenant", "--subject", "acme-ci",
        "--tenant", "acme", "--tenant", "acme-eu",
        cwd=tmp_path,
        BERTH_DATABASE_URL=database_url,
    )
    assert result.returncode == 0, result.stderr
    key = result.stdout.rstrip("\n").splitlines()[-1]
    assert key.startswith("berth_") and " " not in key
    async with db.connection() as conn:
        record = await api_key_get(conn, key=key)
    assert record is not None
    assert (record.role, record.subject) == ("tenant", "acme-ci")
    assert record.tenant_ids == ("acme", "acme-eu")
    assert record.runtime_instance_ids == ()


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["keys", "create", "--role", "admin", "--subject", "ops"], id="keys-create"),
        pytest.param(["keys", "list"], id="keys-list"),
        pytest.param(["keys", "revoke", "00000000-0000-4000-8000-000000000000"],
                     id="keys-revoke"),
        pytest.param(["reconcile"], id="reconcile"),
    ],
)
def test_keys_and_reconcile_refuse_a_missing_embedded_database(
    argv: list[str], tmp_path: Path
) -> None:
    # Run from a directory without a database: the old behaviour made a new empty one in
    # ./.berth and printed a key that the running server answered 401 to.
    result = berth_run(*argv, cwd=tmp_path)
    data_dir = tmp_path / ".berth"
    line = assert_one_line(result, f"no embedded database in {data_dir}", "--data-dir")
    assert "BERTH_DATA_DIR" in line
    assert not (data_dir / "pgdata").exists(), "nothing is created"
    elsewhere = tmp_path / "elsewhere"
    named = berth_run(*argv, "--data-dir", str(elsewhere), cwd=tmp_path)
    assert_one_line(named, f"no embedded database in {elsewhere}")
    assert not (elsewhere / "pgdata").exists()


@pytest.mark.slow
def test_keys_manage_the_embedded_database_named_by_data_dir(tmp_path: Path) -> None:
    data_dir = tmp_path / "berth-data"
    workdir = tmp_path / "somewhere-else"
    workdir.mkdir()
    migrated = berth_run("migrate", "--data-dir", str(data_dir), cwd=workdir)
    assert migrated.returncode == 0, migrated.stderr
    assert f"created a new embedded database in {data_dir}" in migrated.stdout

    created = berth_run(
        "keys", "create", "--role", "runtime", "--subject", "rt", "--runtime-instance", "rt-1",
        "--data-dir", str(data_dir), cwd=workdir,
    )
    assert created.returncode == 0, created.stderr
    key = created.stdout.splitlines()[-1]
    # BERTH_DATA_DIR names the same directory as --data-dir.
    admin = berth_run("keys", "create", "--role", "admin", "--subject", "ops", cwd=workdir,
                      BERTH_DATA_DIR=str(data_dir))
    assert admin.returncode == 0, admin.stderr
    assert not (workdir / ".berth").exists(), "nothing is created in the working directory"

    listed = berth_run("keys", "list", "--data-dir", str(data_dir), cwd=workdir)
    assert listed.returncode == 0, listed.stderr
    assert key not in listed.stdout, "a list never shows a secret"
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    runtime_id = next(i for i, line in rows.items() if " runtime " in line)
    assert "instances=rt-1" in rows[runtime_id]
    assert key[:14] in rows[runtime_id], "the prefix tells keys apart"

    revoked = berth_run("keys", "revoke", runtime_id, "--data-dir", str(data_dir), cwd=workdir)
    assert revoked.returncode == 0, revoked.stderr
    assert f"revoked runtime key {runtime_id}" in revoked.stdout
    active = berth_run("keys", "list", "--active", "--data-dir", str(data_dir), cwd=workdir)
    assert runtime_id not in active.stdout and " admin " in active.stdout
    with EmbeddedPostgres(data_dir) as server:
        assert asyncio.run(key_role(server.url, key)) is None, "a revoked key is not valid"
    assert postgres_processes(data_dir / "pgdata") == []

    admin_id = next(i for i, line in rows.items() if " admin " in line)
    last = berth_run("keys", "revoke", admin_id, "--data-dir", str(data_dir), cwd=workdir)
    assert_one_line(last, "last live admin key")


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        pytest.param(["--role", "tenant", "--subject", "s"], "at least one --tenant",
                     id="tenant-without-tenant"),
        pytest.param(["--role", "runtime", "--subject", "s"], "at least one --runtime-instance",
                     id="runtime-without-instance"),
        pytest.param(["--role", "admin", "--subject", "s", "--runtime-instance", "i"],
                     "runtime keys only", id="instance-on-admin"),
        pytest.param(["--role", "runtime", "--subject", "s", "--runtime-instance", "i",
                      "--tenant", "t"], "tenant and operator keys only", id="tenant-on-runtime"),
        pytest.param(["--role", "admin", "--subject", "  "], "--subject", id="blank-subject"),
        pytest.param(["--role", "tenant", "--subject", "s", "--tenant", ""], "must not be empty",
                     id="blank-tenant"),
    ],
)
def test_keys_create_rejects_bad_arguments_in_one_line(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keys", "create", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], captured.err


@pytest.mark.slow
def test_migrate_upgrades_an_empty_database_to_head(
    empty_database_url: str, tmp_path: Path
) -> None:
    result = berth_run("migrate", cwd=tmp_path, BERTH_DATABASE_URL=empty_database_url)
    assert result.returncode == 0, result.stderr
    assert f"revision {schema_head()}" in result.stdout.splitlines()[-1]

    async def _current() -> str | None:
        db = Database(empty_database_url, max_size=1)
        try:
            async with db.connection() as conn:
                return await schema_current(conn)
        finally:
            await db.close()

    assert asyncio.run(_current()) == schema_head()
    again = berth_run("migrate", cwd=tmp_path, BERTH_DATABASE_URL=empty_database_url)
    assert again.returncode == 0, again.stderr


def _reconcile_exists() -> bool:
    return importlib.util.find_spec("app.reconciler.process") is not None


COMMANDS = [
    pytest.param(["serve", "--port", "0"], id="serve"),
    pytest.param(["migrate"], id="migrate"),
    pytest.param(["keys", "create", "--role", "admin", "--subject", "ops"], id="keys-create"),
    pytest.param(["reconcile"], id="reconcile"),
]


@pytest.mark.slow
@pytest.mark.parametrize("argv", COMMANDS)
def test_unreachable_database_is_one_line(argv: list[str], tmp_path: Path) -> None:
    if argv[0] == "reconcile" and not _reconcile_exists():
        pytest.skip("berth reconcile is not written yet")
    url = f"postgresql://berth:hunter2@127.0.0.1:{port_free()}/berth"
    result = berth_run(*argv, cwd=tmp_path, BERTH_DATABASE_URL=url)
    line = assert_one_line(result, "unreachable", "BERTH_DATABASE_URL")
    assert "hunter2" not in line


@pytest.mark.slow
@pytest.mark.parametrize("argv", [p for p in COMMANDS if p.id != "migrate"])
def test_schema_behind_head_is_one_line(
    argv: list[str], tmp_path: Path, empty_database_url: str
) -> None:
    if argv[0] == "reconcile" and not _reconcile_exists():
        pytest.skip("berth reconcile is not written yet")
    result = berth_run(*argv, cwd=tmp_path, BERTH_DATABASE_URL=empty_database_url)
    assert_one_line(result, "run `berth migrate`")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("variable", "value", "command"),
    [
        pytest.param("BERTH_PORT", "abc", ["serve"], id="port-not-a-number"),
        pytest.param("BERTH_LOG_LEVEL", "loud", ["serve"], id="unknown-log-level"),
        pytest.param("BERTH_DATABASE_URL", "mysql://x@y/z", ["migrate"], id="not-postgresql"),
    ],
)
def test_bad_setting_is_one_line(
    variable: str, value: str, command: list[str], tmp_path: Path
) -> None:
    result = berth_run(*command, cwd=tmp_path, **{variable: value})
    assert_one_line(result, variable)


@pytest.mark.slow
async def test_tenants_set_get_and_list(db: Database, database_url: str, tmp_path: Path) -> None:
    result = await asyncio.to_thread(
        berth_run,
        "tenants", "set", "acme", "--cohort", "research", "--fair-weight", "2",
        "--quota", "gpu-small:cpuMillis=8000:4000", "--quota", "gpu-small:llmSlots=4::2",
        cwd=tmp_path, BERTH_DATABASE_URL=database_url,
    )
    assert result.returncode == 0, result.stderr
    async with db.connection() as conn:
        rows = await conn.fetch("SELECT resource, nominal, borrowing_limit, lending_limit "
                                "FROM tenant_quotas WHERE tenant_id = 'acme' ORDER BY 1")
    assert [tuple(r) for r in rows] == [("cpuMillis", 8000, 4000, None), ("llmSlots", 4, None, 2)]
    listed = await asyncio.to_thread(berth_run, "tenants", "list", cwd=tmp_path,
                                     BERTH_DATABASE_URL=database_url)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[1].split() == [
        "acme", "research", "2", "gpu-small:cpuMillis=8000:4000", "gpu-small:llmSlots=4::2"]
    got = await asyncio.to_thread(berth_run, "tenants", "get", "acme", cwd=tmp_path,
                                  BERTH_DATABASE_URL=database_url)
    assert got.returncode == 0 and '"cohort": "research"' in got.stdout
    bad = await asyncio.to_thread(
        berth_run, "tenants", "set", "acme", "--quota", "gpu-small:cpuMillis=10::20",
        cwd=tmp_path, BERTH_DATABASE_URL=database_url,
    )
    assert_one_line(bad, "lendingLimit 20 is above nominal 10")
    bad = await asyncio.to_thread(
        berth_run, "tenants", "set", "Acme Corp", cwd=tmp_path, BERTH_DATABASE_URL=database_url,
    )
    assert_one_line(bad, "tenant id 'Acme Corp': must be 1 to 63 characters")

"""`berth serve` with BERTH_BOOTSTRAP_ADMIN_KEY_FILE: a given key, stored hashed, not printed."""

from __future__ import annotations

import asyncio
import secrets
import signal
from pathlib import Path

import httpx
import pytest

from app.db import Database
from app.errors import ConfigurationError
from app.ledger.keys import key_generate, key_hash, key_prefix
from app.schema import schema_upgrade
from app.serve import bootstrap_key_read
from tests.test_serve import (
    Serve,
    assert_one_line,
    berth_run,
    database_empty,
    key_role,
    keys_printed,
)


def key_given() -> str:
    """Return a key as the README says to make one: berth_$(openssl rand -hex 32)."""
    return "berth_" + secrets.token_hex(32)


async def schema_migrate(url: str) -> None:
    """Upgrade the database at ``url`` to head, in this process (quicker than `berth migrate`)."""
    await schema_upgrade(url)


async def api_key_rows(url: str) -> list[dict[str, object]]:
    """Return every stored api_keys row of the database at ``url``."""
    db = Database(url, max_size=1)
    try:
        async with db.connection() as conn:
            return [dict(row) for row in await conn.fetch("SELECT * FROM api_keys")]
    finally:
        await db.close()


@pytest.mark.slow
def test_serve_stores_the_key_file_hashed_and_prints_no_key(
    tmp_path: Path, server_url: str
) -> None:
    with database_empty(server_url) as url:
        _serve_twice_with_key_files(tmp_path, url)


def _serve_twice_with_key_files(tmp_path: Path, url: str) -> None:
    asyncio.run(schema_migrate(url))
    key = key_given()
    key_file = tmp_path / "admin-key"
    key_file.write_text(key + "\n")  # as `echo` or an editor leaves it

    first = Serve(tmp_path, tmp_path / "unused", BERTH_DATABASE_URL=url,
                  BERTH_BOOTSTRAP_ADMIN_KEY_FILE=str(key_file), BERTH_RECONCILER_ENABLED="false")
    try:
        first.wait_ready()
        pools = f"http://127.0.0.1:{first.port}/v1/pools"
        assert httpx.get(pools, headers={"Authorization": f"Bearer {key}"}).status_code == 200
        other = {"Authorization": f"Bearer {key_generate()}"}
        assert httpx.get(pools, headers=other).status_code == 401
        assert first.stop(signal.SIGTERM) == 0, first.err.read_text()
    finally:
        first.kill()
    out, err = first.stdout, first.err.read_text()
    assert keys_printed(out) == []
    assert key not in out and key not in err
    assert f"stored the bootstrap admin API key of {key_file}" in out

    (row,) = asyncio.run(api_key_rows(url))
    assert row["bootstrap"] is True and row["role"] == "admin"
    assert row["key_hash"] == key_hash(key) and row["prefix"] == key_prefix(key)
    assert not any(key in str(value) for value in row.values())

    # A restart with another key: the first stays the bootstrap key; the start says so.
    other_key = key_given()
    key_file.write_text(other_key)
    second = Serve(tmp_path, tmp_path / "unused", BERTH_DATABASE_URL=url,
                   BERTH_BOOTSTRAP_ADMIN_KEY_FILE=str(key_file), BERTH_RECONCILER_ENABLED="false")
    try:
        second.wait_ready()
        assert second.stop(signal.SIGTERM) == 0, second.err.read_text()
    finally:
        second.kill()
    assert keys_printed(second.stdout) == []
    assert other_key not in second.stdout + second.err.read_text()
    assert f"warning: the key in {key_file} is not a live key of this database" in second.stdout
    assert asyncio.run(key_role(url, key)) == "admin"
    assert asyncio.run(key_role(url, other_key)) is None
    assert len(asyncio.run(api_key_rows(url))) == 1


@pytest.mark.parametrize(
    "content",
    [
        key_generate(),
        "berth_" + secrets.token_hex(32),
        "berth_" + "A" * 32,
        "berth_" + "a-_9" * 64 + "\r\n",
        "  berth_" + secrets.token_urlsafe(32) + "\n\n",
    ],
    ids=["generated", "openssl-hex", "shortest", "longest-crlf", "padded"],
)
def test_key_file_accepts_well_formed_keys(tmp_path: Path, content: str) -> None:
    path = tmp_path / "key"
    path.write_text(content)
    assert bootstrap_key_read(path) == content.strip()


@pytest.mark.parametrize(
    "content",
    [
        "",
        "berth_",
        "berth_" + "a" * 31,
        "berth_" + "a" * 257,
        "Berth_" + "a" * 40,
        "sk_" + "a" * 40,
        "berth_" + "a" * 20 + " " + "a" * 20,
        "berth_" + "a" * 40 + "\nberth_" + "b" * 40,
        "berth_" + "é" * 40,
        "berth_" + "a" * 40 + "=",
    ],
    ids=["empty", "prefix-only", "too-short", "too-long", "capital-prefix", "other-prefix",
         "space", "two-keys", "non-ascii", "padding"],
)
def test_key_file_refuses_malformed_keys_without_showing_them(
    tmp_path: Path, content: str
) -> None:
    path = tmp_path / "key"
    path.write_text(content)
    with pytest.raises(ConfigurationError) as caught:
        bootstrap_key_read(path)
    message = str(caught.value)
    assert message.startswith(f"BERTH_BOOTSTRAP_ADMIN_KEY_FILE {path} does not hold an API key")
    assert "\n" not in message
    if len(content.strip()) > len("berth_"):
        assert content.strip() not in message


@pytest.mark.slow
def test_serve_with_a_bad_key_file_says_so_in_one_line(tmp_path: Path) -> None:
    bad = "berth_short"
    path = tmp_path / "key"
    path.write_text(bad)
    result = berth_run("serve", "--port", "0", cwd=tmp_path,
                       BERTH_BOOTSTRAP_ADMIN_KEY_FILE=str(path))
    line = assert_one_line(result, "BERTH_BOOTSTRAP_ADMIN_KEY_FILE", "32 to 256 URL-safe")
    assert bad not in line.replace(str(path), "")
    missing = berth_run("serve", "--port", "0", cwd=tmp_path,
                        BERTH_BOOTSTRAP_ADMIN_KEY_FILE=str(tmp_path / "absent"))
    assert_one_line(missing, "cannot read BERTH_BOOTSTRAP_ADMIN_KEY_FILE", "no such file")
    assert not (tmp_path / ".berth").exists()  # refused before any database was started

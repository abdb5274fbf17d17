"""``berth keys list|create|revoke``: manage API keys on the configured database.

The database is ``BERTH_DATABASE_URL`` or the embedded PostgreSQL in ``--data-dir`` /
``BERTH_DATA_DIR``, which must exist already: a key made in a new empty database would be
one no running server knows, so that case is refused with one line naming the directory.
The rules are those of the API (:mod:`app.services.keys`); ``create`` prints the secret
alone on its last line.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from app.auth import KEY_CACHE_SECONDS
from app.config import Settings, get_settings
from app.db import Database
from app.errors import BerthError, ConfigurationError
from app.ledger.keys import ApiKeyRow
from app.services import keys as service
from app.startup import database_describe, database_resolve, settings_for

T = TypeVar("T")

#: Keys listed per query by ``berth keys list`` (it prints every page).
_PAGE = 500


def database_run(settings: Settings, work: Callable[[Database], Awaitable[T]]) -> tuple[T, str]:
    """Run ``work`` on the configured database; return its result and how the database is
    named. Errors of the key rules become one-line configuration errors."""
    url, server = database_resolve(settings, migrate=False, create=False)
    try:

        async def main() -> T:
            db = Database(
                url,
                max_size=1,
                connect_timeout_seconds=settings.db_connect_timeout_seconds,
                application_name="berth-keys",
            )
            try:
                return await work(db)
            finally:
                await db.close()

        try:
            result = asyncio.run(main())
        except BerthError as exc:
            raise ConfigurationError(exc.detail) from None
        return result, database_describe(url, server)
    finally:
        if server is not None:
            server.stop()


def create_key(
    *,
    role: str,
    subject: str,
    tenants: Sequence[str],
    runtime_instances: Sequence[str],
    data_dir: str | Path | None = None,
) -> int:
    """Create an API key on the configured database and print it alone on the last line."""
    try:
        service.key_scope_check(
            role=role, subject=subject, tenants=tenants, runtime_instances=runtime_instances
        )
    except BerthError as exc:
        raise ConfigurationError(exc.detail) from None
    settings = settings_for(get_settings(), data_dir)

    async def work(db: Database) -> tuple[str, ApiKeyRow]:
        return await service.key_create(
            db,
            principal=None,
            role=role,
            subject=subject,
            tenant_ids=tenants,
            runtime_instance_ids=runtime_instances,
        )

    (key, row), where = database_run(settings, work)
    acts_for = ""
    if row.tenant_ids:
        acts_for = f" for tenants {', '.join(row.tenant_ids)}"
    if row.runtime_instance_ids:
        acts_for = f" for runtime instances {', '.join(row.runtime_instance_ids)}"
    print(
        f"berth: created {role} key {row.id} of {row.subject!r}{acts_for} on {where}; "
        "it is shown only now:",
        flush=True,
    )
    print(key, flush=True)
    return 0


def _when(at: datetime | None) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if at is not None else "-"


def _scope(row: ApiKeyRow) -> str:
    if row.tenant_ids:
        return "tenants=" + ",".join(row.tenant_ids)
    if row.runtime_instance_ids:
        return "instances=" + ",".join(row.runtime_instance_ids)
    return "-"


def list_keys(*, include_revoked: bool = True, data_dir: str | Path | None = None) -> int:
    """Print every key (never a secret) as a table, oldest first."""
    settings = settings_for(get_settings(), data_dir)

    async def work(db: Database) -> list[ApiKeyRow]:
        rows: list[ApiKeyRow] = []
        after = None
        while True:
            page, after = await service.keys_page(
                db, after=after, include_revoked=include_revoked, limit=_PAGE
            )
            rows.extend(page)
            if after is None:
                return rows

    rows, _ = database_run(settings, work)
    table = [("ID", "PREFIX", "ROLE", "SUBJECT", "SCOPE", "CREATED", "LAST USED", "REVOKED")]
    table += [
        (str(r.id), r.prefix, r.role, r.subject, _scope(r), _when(r.created_at),
         _when(r.last_used_at), _when(r.revoked_at))
        for r in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    for line in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
    return 0


def revoke_key(*, key_id: str, data_dir: str | Path | None = None) -> int:
    """Revoke the key ``key_id`` (as ``berth keys list`` shows it)."""
    try:
        parsed = uuid.UUID(key_id)
    except ValueError:
        raise ConfigurationError(
            f"{key_id!r} is not a key id; `berth keys list` shows them (first column)"
        ) from None
    settings = settings_for(get_settings(), data_dir)

    async def work(db: Database) -> ApiKeyRow:
        return await service.key_revoke(
            db, principal=None, key_id=parsed, now=datetime.now(UTC)
        )

    row, where = database_run(settings, work)
    print(
        f"berth: revoked {row.role} key {row.id} of {row.subject!r} on {where} at "
        f"{_when(row.revoked_at)}; running servers refuse it within {KEY_CACHE_SECONDS:g} "
        "seconds",
        flush=True,
    )
    return 0

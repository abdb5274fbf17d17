"""``berth keys create``: make an API key and print it alone on the last line."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from app.config import Settings, get_settings
from app.db import Database
from app.errors import ConfigurationError
from app.ledger.keys import api_key_create
from app.startup import database_describe, database_resolve

ROLES = ("admin", "operator", "tenant", "runtime")


class KeyArgumentsInvalid(ConfigurationError):
    """The key's role and the ids it acts for do not fit together."""


def key_arguments_check(
    *, role: str, subject: str, tenants: Sequence[str], runtime_instances: Sequence[str]
) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """Return the cleaned subject, tenants and runtime instances, or raise KeyArgumentsInvalid."""
    if role not in ROLES:
        raise KeyArgumentsInvalid(f"unknown role {role!r}: use one of {', '.join(ROLES)}")
    subject = subject.strip()
    if not subject:
        raise KeyArgumentsInvalid("--subject must not be empty")
    clean_tenants = tuple(dict.fromkeys(t.strip() for t in tenants))
    clean_instances = tuple(dict.fromkeys(i.strip() for i in runtime_instances))
    if "" in clean_tenants or "" in clean_instances:
        raise KeyArgumentsInvalid("--tenant and --runtime-instance values must not be empty")
    if role == "tenant" and not clean_tenants:
        raise KeyArgumentsInvalid("a tenant key needs at least one --tenant TENANT_ID")
    if role == "runtime" and not clean_instances:
        raise KeyArgumentsInvalid(
            "a runtime key needs at least one --runtime-instance INSTANCE_ID"
        )
    if role != "runtime" and clean_instances:
        raise KeyArgumentsInvalid("--runtime-instance applies to runtime keys only")
    if role in ("admin", "runtime") and clean_tenants:
        raise KeyArgumentsInvalid("--tenant applies to tenant and operator keys only")
    return subject, clean_tenants, clean_instances


async def _create(
    url: str,
    settings: Settings,
    *,
    role: str,
    subject: str,
    tenants: tuple[str, ...],
    runtime_instances: tuple[str, ...],
) -> str:
    db = Database(
        url,
        max_size=1,
        connect_timeout_seconds=settings.db_connect_timeout_seconds,
        application_name="berth-keys",
    )
    try:
        async with db.transaction() as conn:
            return await api_key_create(
                conn,
                role=role,
                subject=subject,
                tenant_ids=tenants,
                runtime_instance_ids=runtime_instances,
            )
    finally:
        await db.close()


def create_key(
    *, role: str, subject: str, tenants: Sequence[str], runtime_instances: Sequence[str]
) -> int:
    """Create an API key on the configured database and print it alone on the last line."""
    subject, clean_tenants, clean_instances = key_arguments_check(
        role=role, subject=subject, tenants=tenants, runtime_instances=runtime_instances
    )
    settings = get_settings()
    url, server = database_resolve(settings, migrate=False)
    try:
        key = asyncio.run(
            _create(
                url,
                settings,
                role=role,
                subject=subject,
                tenants=clean_tenants,
                runtime_instances=clean_instances,
            )
        )
    finally:
        if server is not None:
            server.stop()
    acts_for = ""
    if clean_tenants:
        acts_for = f" for tenants {', '.join(clean_tenants)}"
    if clean_instances:
        acts_for = f" for runtime instances {', '.join(clean_instances)}"
    print(
        f"berth: created {role} key of {subject!r}{acts_for} on "
        f"{database_describe(url, server)}; it is shown only now:",
        flush=True,
    )
    print(key, flush=True)
    return 0

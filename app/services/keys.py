"""API keys: list, create and revoke, for admins (and the ``berth keys`` command).

The secret is returned by :func:`key_create` only; nothing stores or lists it again (the
database holds its sha256). Revocation commits before :func:`key_revoke` returns and the
revoking process forgets the key at once; other API processes stop accepting it within
:data:`app.auth.KEY_CACHE_SECONDS`. The last live admin key cannot be revoked (409): an
operator would otherwise lock every admin out of the API.

Every write commits before its function returns and logs only after the commit.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import datetime

from app.auth import ADMIN, OPERATOR, RUNTIME, TENANT, KeyCache, Principal
from app.db import Database
from app.errors import Unprocessable
from app.ledger.keys import ApiKeyRow, api_key_issue, api_key_revoke, api_keys_list

__all__ = ["ROLES", "KeyScopeInvalid", "key_create", "key_revoke", "key_scope_check", "keys_page"]

ROLES = (ADMIN, OPERATOR, TENANT, RUNTIME)

log = logging.getLogger("berth.keys")


class KeyScopeInvalid(Unprocessable):
    """The key's role and the ids it acts for do not fit together."""


def key_scope_check(
    *, role: str, subject: str, tenants: Sequence[str], runtime_instances: Sequence[str]
) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """Return the cleaned subject, tenants and runtime instances, or raise KeyScopeInvalid.

    Tenant keys act for at least one tenant, runtime keys for at least one runtime
    instance; operators may also read for tenants; admins act for everything already.
    """
    if role not in ROLES:
        raise KeyScopeInvalid(f"unknown role {role!r}: use one of {', '.join(ROLES)}")
    subject = subject.strip()
    if not subject:
        raise KeyScopeInvalid("the subject (--subject) must not be empty")
    clean_tenants = tuple(dict.fromkeys(t.strip() for t in tenants))
    clean_instances = tuple(dict.fromkeys(i.strip() for i in runtime_instances))
    if "" in clean_tenants or "" in clean_instances:
        raise KeyScopeInvalid("tenant and runtime instance ids must not be empty")
    if role == TENANT and not clean_tenants:
        raise KeyScopeInvalid(
            "a tenant key needs at least one --tenant TENANT_ID (tenantIds in the API)"
        )
    if role == RUNTIME and not clean_instances:
        raise KeyScopeInvalid(
            "a runtime key needs at least one --runtime-instance INSTANCE_ID "
            "(runtimeInstanceIds in the API)"
        )
    if role != RUNTIME and clean_instances:
        raise KeyScopeInvalid("runtime instance ids apply to runtime keys only")
    if role in (ADMIN, RUNTIME) and clean_tenants:
        raise KeyScopeInvalid("tenant ids apply to tenant and operator keys only")
    return subject, clean_tenants, clean_instances


async def keys_page(
    db: Database,
    *,
    after: tuple[datetime, uuid.UUID] | None,
    include_revoked: bool,
    limit: int,
) -> tuple[list[ApiKeyRow], tuple[datetime, uuid.UUID] | None]:
    """Return a page of keys in creation order and the position the next page starts after."""
    async with db.connection() as conn:
        return await api_keys_list(
            conn, after=after, include_revoked=include_revoked, limit=limit
        )


async def key_create(
    db: Database,
    *,
    principal: Principal | None,
    role: str,
    subject: str,
    tenant_ids: Sequence[str],
    runtime_instance_ids: Sequence[str],
    now: datetime | None = None,
) -> tuple[str, ApiKeyRow]:
    """Create a key and return its secret (shown only now) and its stored row.

    ``principal`` is the admin asking (None for the ``berth keys`` command).
    """
    subject, tenants, instances = key_scope_check(
        role=role, subject=subject, tenants=tenant_ids, runtime_instances=runtime_instance_ids
    )
    async with db.transaction() as conn:
        key, row = await api_key_issue(
            conn,
            role=role,
            subject=subject,
            tenant_ids=tenants,
            runtime_instance_ids=instances,
            now=now,
        )
    log.info(
        "API key created",
        extra={"key_id": str(row.id), "role": role, "key_subject": subject,
               "subject": principal.subject if principal else "berth keys"},
    )
    return key, row


async def key_revoke(
    db: Database,
    *,
    principal: Principal | None,
    key_id: uuid.UUID,
    now: datetime,
    cache: KeyCache | None = None,
) -> ApiKeyRow:
    """Revoke the key ``key_id``, commit, forget it in ``cache``, and return it.

    404 for an unknown id, 409 for the last live admin key; a key revoked before is
    returned unchanged.
    """
    async with db.transaction() as conn:
        row = await api_key_revoke(conn, key_id=key_id, now=now)
    if cache is not None:
        cache.forget(key_id)
    log.info(
        "API key revoked",
        extra={"key_id": str(key_id), "subject": principal.subject if principal else "berth keys"},
    )
    return row

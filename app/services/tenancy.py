"""Which tenants a tenant key acts for in one request: the key's, narrowed by X-Berth-Tenant.

A key that acts for several tenants names the one it writes for in ``X-Berth-Tenant``;
reads cover all of its tenants unless that header narrows them.
"""

from __future__ import annotations

import dataclasses

from app.auth import Principal
from app.errors import BadRequest

__all__ = [
    "TenantAmbiguous", "TenantUnknown", "principal_narrowed", "tenant_acting", "tenants_reading",
]


class TenantAmbiguous(BadRequest):
    """This key acts for several tenants: name one in the X-Berth-Tenant header."""


class TenantUnknown(BadRequest):
    """The X-Berth-Tenant header names a tenant this key does not act for."""


def tenant_acting(principal: Principal, header: str | None) -> str:
    """Return the one tenant a write acts for, from the key and ``X-Berth-Tenant``."""
    if header is not None:
        if header not in principal.tenant_ids:
            raise TenantUnknown()
        return header
    if len(principal.tenant_ids) == 1:
        return next(iter(principal.tenant_ids))
    if not principal.tenant_ids:
        raise TenantUnknown("this key acts for no tenant")
    raise TenantAmbiguous()


def tenants_reading(principal: Principal, header: str | None) -> frozenset[str]:
    """Return the tenants a read covers: all of the key's, or the one ``X-Berth-Tenant`` names."""
    if header is None:
        return principal.tenant_ids
    if header not in principal.tenant_ids:
        raise TenantUnknown()
    return frozenset((header,))


def principal_narrowed(principal: Principal, header: str | None) -> Principal:
    """Return ``principal`` acting only for the tenant ``X-Berth-Tenant`` names (as it is
    without the header); 400 when the key does not act for that tenant."""
    if header is None:
        return principal
    if header not in principal.tenant_ids:
        raise TenantUnknown()
    return dataclasses.replace(principal, tenant_ids=frozenset((header,)))

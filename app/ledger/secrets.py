"""Server secrets SQL: a secret generated once and shared by every process of a deployment."""

from __future__ import annotations

from app.db import Connection

__all__ = ["server_secret_get"]

_INSERT = "INSERT INTO server_secrets (name, secret) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING"
_READ = "SELECT secret FROM server_secrets WHERE name = $1"


async def server_secret_get(conn: Connection, *, name: str, candidate: bytes) -> bytes:
    """Return the stored secret ``name``, storing ``candidate`` first when there is none.

    Processes that start together each offer a candidate; the first insert wins and all of
    them read the one stored (the read is its own statement, so it sees the winner's commit).
    """
    await conn.execute(_INSERT, name, candidate)
    secret = await conn.fetchval(_READ, name)
    assert secret is not None, "a secret inserted or kept is there to read"
    return bytes(secret)

"""Sealed tokens: stable, the same length whatever they hold, opened only in their scope, and
one secret for every process of a deployment."""

from __future__ import annotations

import asyncio
import secrets

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.db import Database
from app.services.tokens import KEY_BYTES, InvalidToken, Tokens, TokenSource

TOKENS = Tokens(secrets.token_bytes(KEY_BYTES))


@given(st.integers(min_value=0, max_value=2**63 - 1), st.text(max_size=40))
def test_a_token_opens_to_its_value_in_its_scope_only(value: int, scope: str) -> None:
    token = TOKENS.seal(value, scope=scope)
    assert len(token) == 32 and token.isascii()
    assert TOKENS.seal(value, scope=scope) == token
    assert TOKENS.open(token, scope=scope) == value
    with pytest.raises(InvalidToken):
        TOKENS.open(token, scope=scope + "x")


@pytest.mark.parametrize("token", [
    "", "MQ", "!!!", "é" * 32, "A" * 32, "A" * 33, "A" * 200,
    TOKENS.seal(7, scope="tasks:acme")[:-1],
], ids=["empty", "old-style", "not-base64", "not-ascii", "forged", "bad-length", "long",
        "truncated"])
def test_anything_but_a_token_made_here_is_refused(token: str) -> None:
    with pytest.raises(InvalidToken):
        TOKENS.open(token, scope="tasks:acme")


def test_another_secret_opens_nothing() -> None:
    token = TOKENS.seal(7, scope="tasks:acme")
    with pytest.raises(InvalidToken):
        Tokens(secrets.token_bytes(KEY_BYTES)).open(token, scope="tasks:acme")


async def test_processes_starting_together_share_one_stored_secret(
    db: Database, database_url: str
) -> None:
    # Separate pools, as separate processes would have, racing for the first secret.
    others = [Database(database_url, max_size=2) for _ in range(4)]
    try:
        sources = [TokenSource(d) for d in (db, *others)]
        tokens = await asyncio.gather(*(s.get() for s in sources))
    finally:
        for d in others:
            await d.close()
    sealed = {t.seal(42, scope="events:x") for t in tokens}
    assert len(sealed) == 1
    async with db.connection() as conn:
        assert await conn.fetchval("SELECT count(*) FROM server_secrets") == 1
    # A process started later reads the same secret.
    assert (await TokenSource(db).get()).open(sealed.pop(), scope="events:x") == 42

"""Array literals mean to the server exactly what the lists they were built from mean."""

from __future__ import annotations

import uuid

from app.db import Database
from app.ledger.literals import array_literal, uuid_array_literal

TEXTS = [
    "pool-1", "", None, "NULL", "a b", "a,b", "{x}", 'say "hi"', "back\\slash", "tab\there",
    "new\nline", "\x01\x1f", "é ü ✓", "'quoted'",
]


async def test_texts_round_trip_through_the_server(db: Database) -> None:
    async with db.connection() as conn:
        for values in ([], ["only"], [""], [None], TEXTS, [t for t in TEXTS if t is not None]):
            got = await conn.fetchval("SELECT $1::text::text[]", array_literal(values))
            assert got == values, values


async def test_numbers_booleans_and_uuids_round_trip(db: Database) -> None:
    ids = [uuid.uuid4() for _ in range(3)]
    async with db.connection() as conn:
        assert await conn.fetchval(
            "SELECT $1::text::bigint[]", array_literal([0, -1, 2**62, None])
        ) == [0, -1, 2**62, None]
        assert await conn.fetchval(
            "SELECT $1::text::boolean[]", array_literal([True, False, None])
        ) == [True, False, None]
        assert await conn.fetchval("SELECT $1::text::uuid[]", uuid_array_literal(ids)) == ids
        assert await conn.fetchval("SELECT $1::text::uuid[]", uuid_array_literal([])) == []

"""Delimited columns mean to the server exactly what the lists they were built from mean."""

from __future__ import annotations

import uuid

import orjson

from app.db import Database
from app.ledger.literals import (
    ids_joined,
    ints_joined,
    json_joined,
    plain_joined,
    texts_joined,
    uuids_joined,
)

DOCS = [{"a": "x\x1ey", "b": [1, 2.5, None], "c": 'quote " and \\ and \n'}, {}, [], "é", 0]


async def test_columns_round_trip_through_the_server(db: Database) -> None:
    ids = [uuid.uuid4() for _ in range(3)]
    async with db.connection() as conn:
        for values in ([], [0], [0, -1, 2**62]):
            assert await conn.fetchval(
                "SELECT string_to_array($1::text, ',')::bigint[]", ints_joined(values)
            ) == values
        for values in ([], ids[:1], ids):
            assert await conn.fetchval(
                "SELECT string_to_array($1::text, ',')::uuid[]", uuids_joined(values)
            ) == values
        for values in ([], ["p-1"], ["p-1", "a0", "zz-9"]):
            assert await conn.fetchval(
                "SELECT string_to_array($1::text, ',')", ids_joined(values)
            ) == values
        docs = await conn.fetchval(
            "SELECT array_agg(d::jsonb::text ORDER BY n) FROM "
            "unnest(string_to_array($1::text, E'\\x1e')) WITH ORDINALITY AS x(d, n)",
            json_joined(DOCS),
        )
        assert [orjson.loads(d) for d in docs] == DOCS


async def test_texts_joined_takes_texts_as_they_are(db: Database) -> None:
    texts = ['{"poolId":"p-1","score":1.5}', "[]", '"\\u001e"']
    async with db.connection() as conn:
        docs = await conn.fetchval(
            "SELECT array_agg(d::jsonb::text ORDER BY n) FROM "
            "unnest(string_to_array($1::text, E'\\x1e')) WITH ORDINALITY AS x(d, n)",
            texts_joined([*texts, orjson.dumps({"a": "x\x1ey"}).decode()]),
        )
    assert [orjson.loads(d) for d in docs] == [*map(orjson.loads, texts), {"a": "x\x1ey"}]


async def test_plain_joined_splits_back_into_its_texts_or_is_none(db: Database) -> None:
    async with db.connection() as conn:
        for values in ([], ["rt-1"], ["a,b", "", "é x"], ["", ""]):
            joined = plain_joined(values)
            assert joined is not None
            assert await conn.fetchval(
                "SELECT string_to_array($1::text, E'\\x1e')", joined
            ) == values
    assert plain_joined(["a\x1eb"]) is None
    assert plain_joined(["a", "b\x1e"]) is None
    assert plain_joined([""]) is None

"""A pass's statement arguments as delimited text: one text parameter per column.

asyncpg encodes a list parameter element by element, and checks every element against
``collections.abc`` (Python-level ``isinstance`` calls) first. A pass's statements send about
a dozen elements per placement, so that encoding would be most of the reconciler's CPU in
``plan_apply``. The same column sent as one delimited text is an order of magnitude cheaper to
build here, and the statement splits it: ``string_to_array($9::text, ',')::bigint[]``.

That form, not an array literal (``$9::text::bigint[]``), because it is immutable: in the
custom plan of a pass's statement (``plan_cache_mode``, :mod:`app.ledger.claims`) it folds to a
constant array whose length the planner sees, so it hashes the joins over a thousand rows
instead of looping (an array literal's input function is only stable, and the planner then
guesses ten elements: a nested loop, quadratic in the batch).

Only values that cannot contain the delimiter go this way: UUIDs, integers, pool ids (ASCII
slugs, a check constraint) and JSON documents (orjson escapes every control character, so a
record separator never occurs in one). Other texts stay lists, or are joined only when none
of them contains the delimiter (:func:`plain_joined`, whose caller keeps the list form for
the others).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import orjson

__all__ = [
    "JSON_SEPARATOR",
    "ids_joined",
    "ints_joined",
    "json_joined",
    "plain_joined",
    "texts_joined",
    "uuids_joined",
]

#: Separates the JSON documents of :func:`json_joined` (``E'\x1e'`` in SQL).
JSON_SEPARATOR = b"\x1e"


def ints_joined(values: Sequence[int]) -> str:
    """Return integers joined by commas (for ``string_to_array($n::text, ',')::bigint[]``)."""
    return orjson.dumps(values)[1:-1].decode()


def uuids_joined(values: Sequence[uuid.UUID]) -> str:
    """Return UUIDs joined by commas (for ``string_to_array($n::text, ',')::uuid[]``)."""
    return ",".join([str(v) for v in values])


def ids_joined(values: Sequence[str]) -> str:
    """Return pool ids joined by commas (for ``string_to_array($n::text, ',')``).

    Pool ids are slugs (``ck_pools_id_slug``): never empty, never a comma.
    """
    return ",".join(values)


def json_joined(values: Sequence[object]) -> str:
    """Return each value as a JSON document, joined by :data:`JSON_SEPARATOR` (for
    ``string_to_array($n::text, E'\\x1e')``, each element then cast to ``jsonb``)."""
    return JSON_SEPARATOR.join([orjson.dumps(v) for v in values]).decode()


def texts_joined(texts: Sequence[str]) -> str:
    """Return JSON texts (as orjson writes them: every control character escaped) joined by
    :data:`JSON_SEPARATOR`, each taken as it is."""
    return "\x1e".join(texts)


def plain_joined(texts: Sequence[str]) -> str | None:
    """Return free texts joined by :data:`JSON_SEPARATOR` (for ``string_to_array($n::text,
    E'\\x1e')``), or None when that would not split back into them: some text contains the
    separator, or the only text is empty (an empty text splits into no element)."""
    if not texts:
        return ""
    joined = "\x1e".join(texts)
    if not joined or joined.count("\x1e") != len(texts) - 1:
        return None
    return joined

"""Tenant-consistent shards: a tenant's tasks always fall in the same slot."""

from __future__ import annotations

import zlib

from app.config import SHARD_SLOTS


def shard_of(tenant_id: str, slots: int = SHARD_SLOTS) -> int:
    """Return the shard slot of ``tenant_id``: a stable CRC-32 of its UTF-8 bytes mod ``slots``.

    Python's ``hash()`` is salted per process, so it would scatter a tenant across slots
    between replicas; CRC-32 is the same everywhere and forever.
    """
    return zlib.crc32(tenant_id.encode()) % slots


def shard_parse(value: str) -> tuple[int, int]:
    """Parse ``INDEX/COUNT`` into a pair, or raise ValueError saying what is wrong."""
    try:
        index_s, count_s = value.split("/")
        index, count = int(index_s), int(count_s)
    except ValueError:
        raise ValueError(f"shard must look like INDEX/COUNT (e.g. 0/2), not {value!r}") from None
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"shard {value!r}: need COUNT >= 1 and 0 <= INDEX < COUNT")
    if count > SHARD_SLOTS:
        raise ValueError(f"shard {value!r}: COUNT may be at most {SHARD_SLOTS} (the slot count)")
    return index, count


def shard_slots_static(index: int, count: int, slots: int = SHARD_SLOTS) -> frozenset[int]:
    """Return the slots owned by static shard ``index`` of ``count``."""
    return frozenset(s for s in range(slots) if s % count == index)

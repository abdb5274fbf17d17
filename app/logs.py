"""Structured logs: one JSON object a line, with extra fields (task, pass, request ids)."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import orjson

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "color_message",  # uvicorn's ANSI-coloured copy of msg
}


class JsonFormatter(logging.Formatter):
    """Format a record as one JSON line with its extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        """Return the record as a JSON line."""
        entry = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


class LogSummary:
    """One log line per interval for a condition that may happen on every request (a busy
    pool, an unreachable database): the first occurrence is logged at once, the ones after it
    within ``interval_seconds`` are counted, and one line with their count follows when the
    interval ends. Under overload the log grows by a line per interval, not one per request.
    """

    def __init__(self, logger: logging.Logger, message: str, *,
                 interval_seconds: float = 10.0) -> None:
        self.logger = logger
        self.message = message
        self.interval_seconds = interval_seconds
        self._last = -float("inf")
        self._counts: Counter[str] = Counter()
        self._flush: asyncio.TimerHandle | None = None
        self._flush_loop: asyncio.AbstractEventLoop | None = None

    def note(self, error: str, *, exc_info: bool = False, **extra: Any) -> None:
        """Count one occurrence (``error`` names its kind); log it if the interval is over."""
        now = time.monotonic()
        due = self._last + self.interval_seconds
        if now >= due and not self._counts:
            self._last = now
            self.logger.warning(self.message, exc_info=exc_info,
                                extra={"error": error, "count": 1, **extra})
            return
        self._counts[error] += 1
        if now >= due:
            self.flush()
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop to flush from: the next note after the interval does
            return
        if self._flush is None or self._flush_loop is not loop:
            self._flush_loop = loop
            self._flush = loop.call_later(due - now, self.flush)

    def flush(self) -> None:
        """Log the occurrences counted since the last line (if any), in one line."""
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        if not self._counts:
            return
        counts, self._counts = self._counts, Counter()
        self._last = time.monotonic()
        self.logger.warning(
            f"{self.message} ({sum(counts.values())} more times since the line before)",
            extra={"error": ",".join(sorted(counts)), "count": sum(counts.values())})


def logging_configure(level: str = "info") -> None:
    """Send every log record (Berth's, uvicorn's, SQLAlchemy's) to stderr as JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True
    # Alembic logs each plugin it sets up (at import) and every readiness probe at info;
    # Berth reports schema revisions itself.
    logging.getLogger("alembic").setLevel(max(logging.WARNING, root.level))
    # Access logs at info would be one line per request; keep them for debug.
    logging.getLogger("uvicorn.access").setLevel(
        logging.DEBUG if level == "debug" else logging.WARNING
    )


def uvicorn_log_config() -> dict:
    """Return a uvicorn log config that leaves formatting to the root JSON handler."""
    return {"version": 1, "disable_existing_loggers": False}

"""Structured logs: one JSON object a line, with extra fields (task, pass, request ids)."""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime

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

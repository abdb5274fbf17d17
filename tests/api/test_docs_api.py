"""docs/api.md says what the OpenAPI document declares: the status codes of every operation
(the table "Status codes by operation"), and a row in the error table for every error status
the document declares. The document, in turn, is checked against the server's answers by
tests/api/test_schemathesis.py and against the code by tests/api/test_openapi.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

from app.api.common import HTTP_LAYER_STATUSES
from app.api.openapi import openapi_build
from app.config import Settings
from app.main import create_app

DOCS = Path(__file__).resolve().parents[2] / "docs"
API_MD = DOCS / "api.md"

_ROW = re.compile(r"^\|\s*`(?P<op>\w+)`\s*\|(?P<success>[^|]*)\|(?P<errors>[^|]*)\|\s*$")


def _section(text: str, heading: str) -> list[str]:
    """Return the lines under ``heading`` up to the next heading of any level."""
    lines = text.splitlines()
    start = lines.index(heading) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("#")), len(lines))
    return lines[start:end]


def _codes(cell: str) -> set[int]:
    return {int(code) for code in re.findall(r"\b[1-5]\d\d\b", cell)}


def documented_statuses(text: str) -> dict[str, set[int]]:
    """Return the statuses docs/api.md gives each operation, the HTTP layer's included."""
    table: dict[str, set[int]] = {}
    for line in _section(text, "### Status codes by operation"):
        row = _ROW.match(line)
        if row:
            assert row["op"] not in table, f"{row['op']} appears twice in the table"
            table[row["op"]] = (
                _codes(row["success"]) | _codes(row["errors"]) | set(HTTP_LAYER_STATUSES)
            )
    return table


def declared_statuses(document: dict) -> dict[str, set[int]]:
    """Return the statuses the OpenAPI document declares for each operation."""
    return {
        op["operationId"]: {int(code) for code in op["responses"]}
        for path in document["paths"].values()
        for op in path.values()
    }


def _document() -> dict:
    app = create_app(Settings(database_url="postgresql://unused@127.0.0.1:1/unused"))
    return openapi_build(app)


def test_the_status_table_of_api_md_matches_the_document() -> None:
    documented = documented_statuses(API_MD.read_text())
    declared = declared_statuses(_document())
    assert len(declared) >= 15
    missing = sorted(set(declared) - set(documented))
    assert not missing, f"docs/api.md has no status row for {missing}"
    unknown = sorted(set(documented) - set(declared))
    assert not unknown, f"docs/api.md lists operations the document does not have: {unknown}"
    wrong = {
        op: {"only in docs/api.md": sorted(documented[op] - declared[op]),
             "only in the document": sorted(declared[op] - documented[op])}
        for op in declared
        if documented[op] != declared[op]
    }
    assert not wrong, wrong


def test_the_committed_document_is_the_one_compared() -> None:
    committed = json.loads((DOCS / "openapi.json").read_text())
    assert declared_statuses(committed) == declared_statuses(_document())


def test_every_declared_error_status_is_explained_in_the_error_table() -> None:
    explained = {
        int(row.group(1))
        for line in _section(API_MD.read_text(), "## Errors")
        if (row := re.match(r"^\|\s*(\d{3})\s*\|", line))
    }
    declared = set().union(*declared_statuses(_document()).values())
    errors = {status for status in declared if status >= 400}
    assert errors <= explained, sorted(errors - explained)


def test_the_table_parser_sees_a_wrong_row() -> None:
    """The comparison can fail: a row that drops or adds a status no longer matches."""
    text = API_MD.read_text()
    section = _section(text, "### Status codes by operation")
    row = next(line for line in section if line.startswith("| `createTask`"))
    dropped = text.replace(row, row.replace("415, ", ""))
    added = text.replace(row, row.replace("409", "409, 412"))
    declared = declared_statuses(_document())["createTask"]
    assert documented_statuses(dropped)["createTask"] == declared - {415}
    assert documented_statuses(added)["createTask"] == declared | {412}

"""`berth --help` and every subcommand's help read as plain text; the README lists them all."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.cli import build_parser

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()

#: reStructuredText that would show raw in a terminal: ``literals``, :roles:`x`, "::" blocks
#: and ".. " directives.
REST_MARKUP = re.compile(r"``|:[a-z]+:`|::\s*$|^\s*\.\. ", re.MULTILINE)


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Yield (command words, parser) for ``berth`` and every subcommand under it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))


COMMANDS = list(commands(build_parser()))


@pytest.mark.parametrize(
    ("path", "parser"), COMMANDS, ids=[" ".join(("berth", *p)) for p, _ in COMMANDS]
)
def test_help_reads_as_plain_text(path: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
    text = parser.format_help()

    assert not REST_MARKUP.search(text), text
    assert parser.description, f"`berth {' '.join(path)} --help` does not say what it does"


def test_readme_lists_every_command() -> None:
    section = README.split("## Commands", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `berth ")]

    for path, _ in COMMANDS:
        if len(path) == 1:
            assert any(row.startswith(f"| `berth {path[0]}") for row in rows), path
    assert any(row.startswith("| `berth openapi") for row in rows)

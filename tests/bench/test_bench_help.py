"""`berth bench --help` and every target's help: plain text, the PostgreSQL it uses, every
option explained, every target in the README."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from app.cli import main
from bench.cli import TARGETS, target_parser

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
REST_MARKUP = re.compile(r"``|:[a-z]+:`|::\s*$|^\s*\.\. ", re.MULTILINE)


def test_bench_help_names_its_postgresql_and_every_target(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert exited.value.code == 0
    assert text.startswith("usage: berth bench")
    assert "BERTH_DATABASE_URL" in text and "embedded PostgreSQL" in text
    for target in TARGETS:
        assert f" {target} " in text, target


@pytest.mark.parametrize("target", list(TARGETS))
def test_target_help_reads_as_plain_text(target: str, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", target, "--help"])
    text = capsys.readouterr().out
    assert exited.value.code == 0
    assert text.startswith(f"usage: berth bench {target}"), text
    assert not REST_MARKUP.search(text), text
    description = " ".join(text.split("\n\n")[1].split())
    assert "embedded PostgreSQL" in description and "BERTH_DATABASE_URL" in description


@pytest.mark.parametrize("target", list(TARGETS))
def test_every_option_has_help(target: str) -> None:
    parser = target_parser(target)
    silent = [
        action.option_strings[0] for action in parser._actions
        if action.option_strings and not isinstance(action, argparse._HelpAction)
        and not (action.help and action.help.strip())
    ]
    assert silent == []
    server = next(a for a in parser._actions if "--server-url" in a.option_strings)
    assert "embedded PostgreSQL" in server.help


def test_readme_lists_every_target() -> None:
    section = README.split("## Commands", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `berth bench")]
    for target in TARGETS:
        assert any(target in row for row in rows), target


def test_an_unknown_target_is_refused(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "core"])
    assert exited.value.code == 2
    assert "invalid choice" in capsys.readouterr().err

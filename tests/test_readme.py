"""README.md documents every setting with its real default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.config import Settings

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def _shown(default: object) -> str:
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if hasattr(default, "value"):
        return f"`{default.value}`"
    return f"`{default}`"


@pytest.mark.parametrize("name", sorted(Settings.model_fields))
def test_every_setting_is_documented_with_its_default(name: str) -> None:
    env = f"BERTH_{name.upper()}"
    match = re.search(rf"^\| `{env}` \| ([^|]*) \|", README, re.MULTILINE)
    assert match, f"{env} is missing from README.md's configuration table"
    assert match.group(1).strip() == _shown(Settings.model_fields[name].default)


def test_readme_opens_with_the_two_commands() -> None:
    blocks = re.findall(r"```sh\n(.*?)\n```", README, re.DOTALL)
    assert blocks[:2] == [
        "pip install -e . && berth serve",
        "pip install -e '.[dev]' && python -m pytest -q",
    ]


def test_every_row_of_the_configuration_table_is_a_setting() -> None:
    section = README.split("Every setting is an environment variable", 1)[1]
    table = section.split("\n\n", 2)[1]
    rows = re.findall(r"^\| `BERTH_(\w+)` \|", table, re.MULTILINE)
    assert rows, "README.md's configuration table was not found"
    assert sorted(name.lower() for name in rows) == sorted(Settings.model_fields)

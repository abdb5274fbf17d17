"""A reconciler process does without SQLAlchemy and Alembic (some 30 MiB of its memory): plain
database URLs are rendered as SQLAlchemy renders them, and the schema head is read from the
migration files as Alembic reads it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from sqlalchemy.engine import make_url

from app.db import async_url, describe_url, plain_url
from app.errors import ConfigurationError
from app.schema import alembic_config, schema_head

URLS = [
    "postgresql://postgres@127.0.0.1:5432/postgres",
    "postgresql://postgres@127.0.0.1/berth",
    "postgres://u:secret@db.example.com:6543/x_y-z",
    "postgresql+asyncpg://u:p@h/d",
    "postgresql+psycopg://u@h:1/d",
    "postgresql://host-only",
    "postgresql://u:p@h",
    "postgresql://u@h:5432",
    # not plain: SQLAlchemy renders them
    "postgresql://u:p%40ss@h/d",
    "postgresql://u:p@ss@h/d",
    "postgresql://u@/d?host=/tmp/socket",
    "postgresql://u@h/d?sslmode=require&application_name=x",
    "postgresql://u@[::1]:5432/d",
    "postgresql://u@h:05432/d",
    "postgresql://u:@h/d",
    "postgresql:///d",
]


@pytest.mark.parametrize("url", URLS)
def test_urls_render_as_sqlalchemy_renders_them(url: str) -> None:
    parsed = make_url(url)
    assert plain_url(url) == parsed.set(drivername="postgresql").render_as_string(False)
    assert async_url(url) == parsed.set(drivername="postgresql+asyncpg").render_as_string(False)
    assert describe_url(url) == parsed.render_as_string(hide_password=True)


@pytest.mark.parametrize("url", ["mysql://u@h/d", "not a url", "sqlite:///x.db"])
def test_other_urls_are_refused_as_before(url: str) -> None:
    with pytest.raises(ConfigurationError):
        plain_url(url)


def test_the_schema_head_is_alembics() -> None:
    from alembic.script import ScriptDirectory

    assert schema_head() == ScriptDirectory.from_config(alembic_config()).get_current_head()


def test_a_reconciler_process_imports_neither_sqlalchemy_nor_alembic() -> None:
    code = (
        "import sys\n"
        "from app.reconciler.process import run_reconciler\n"
        "from app.db import Database, describe_url\n"
        "from app.startup import schema_ensure_head\n"
        "from app.schema import schema_head\n"
        "url = 'postgresql://berth:pw@127.0.0.1:5432/berth'\n"
        "Database(url); describe_url(url)\n"
        "schema_ensure_head(schema_head(), url=url)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'sqlalchemy', 'alembic'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"

"""A reconciler process does without SQLAlchemy and Alembic (some 30 MiB of its memory): its
database URL is read without them, and the schema head is read from the migration files as
Alembic reads it."""

from __future__ import annotations

import subprocess
import sys

from app.schema import alembic_config, schema_head


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

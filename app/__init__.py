"""Berth: a multi-tenant, explainable placement scheduler with a durable PostgreSQL ledger."""

from app.compiled import install as _compiled_install

__version__ = "0.1.0"

# The scheduling core runs compiled, or from its source files (app/compiled.py).
_compiled_install()

"""Alembic migrations of Berth's schema (one revision per change, readable slugs)."""

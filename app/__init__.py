"""Berth: a multi-tenant, explainable placement scheduler with a durable PostgreSQL ledger."""

__version__ = "0.1.0"

"""Alembic migrations of the ledger schema (a package so that env.py ships with onceflow)."""

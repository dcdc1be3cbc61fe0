"""Fixtures of the integration tests that need more than the stack's connections (tests/conftest.py)."""

from __future__ import annotations

import pytest
from local_stack.spark_runtime import SparkRuntime

from onceflow.ledger import Ledger


@pytest.fixture
def pg_ledger(pg_database: str) -> Ledger:
    """A ledger in a fresh PostgreSQL database, its schema created. Its URL is a plain postgresql://
    one, as ONCEFLOW_PG_DSN is written: that must work as a ledger URL too."""
    ledger = Ledger.connect(pg_database, check=False)
    ledger.upgrade()
    return ledger


@pytest.fixture(scope="session")
def runtime() -> SparkRuntime:
    """The local warm runtime. Session-scoped, so it is resolved before any test's ``stack`` points
    ONCEFLOW_HOME at a temporary folder."""
    return SparkRuntime.from_env()

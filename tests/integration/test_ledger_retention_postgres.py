"""Ledger retention on the stack's PostgreSQL: the checks of tests/unit/test_ledger_retention.py, each on
a fresh database."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from onceflow.ledger import Ledger
from tests.unit.test_ledger_retention import CHECKS

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_retention_on_postgresql(pg_ledger: Ledger, check: Callable[[Ledger], None]) -> None:
    try:
        check(pg_ledger)
    finally:
        pg_ledger.close()

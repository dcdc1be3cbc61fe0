"""The ledger on the stack's PostgreSQL: schema handling and the random-interleaving state machine."""

from __future__ import annotations

import psycopg
import pytest

from onceflow.ledger import EpochStatus, Ledger, SchemaMismatch
from onceflow.offsets import OffsetRange
from onceflow.testing import coordinator_for_tests
from tests.unit.test_dead_letter_pages import check_pages
from tests.unit.test_ledger import check_a_ledger_with_state_snapshot_rows_upgrades_and_downgrades
from tests.unit.test_ledger_state_machine import run_machine

pytestmark = pytest.mark.integration


def test_fresh_postgresql_database_needs_upgrade_then_works(pg_database: str) -> None:
    with pytest.raises(SchemaMismatch, match="not initialised, run `onceflow db upgrade`"):
        Ledger.connect(pg_database)
    Ledger.connect(pg_database, check=False).upgrade()
    with Ledger.connect(pg_database.replace("postgresql://", "postgresql+psycopg://", 1)) as ledger:
        e = ledger.plan_epoch("p", [OffsetRange("in", 0, 0, 3)], [])
        assert coordinator_for_tests(ledger, "p", {}).commit(number=e.number).status is EpochStatus.COMMITTED
        assert ledger.committed_offsets("p") == {("in", 0): 3}


def test_a_ledger_with_state_snapshot_rows_upgrades_and_downgrades_on_postgresql(pg_database: str) -> None:
    check_a_ledger_with_state_snapshot_rows_upgrades_and_downgrades(pg_database)


def test_postgresql_itself_refuses_a_second_open_epoch(pg_ledger: Ledger, pg_database: str) -> None:
    pg_ledger.plan_epoch("p", [], [])
    with psycopg.connect(pg_database) as conn, pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute(
            "INSERT INTO epochs (pipeline, epoch, status, attempt_token, expected_participants, planned_at)"
            " VALUES ('p', 2, 'COMMITTING', 'x', '[]', now())"
        )


def test_random_interleavings_keep_every_invariant_on_postgresql(pg_ledger: Ledger) -> None:
    run_machine(pg_ledger, max_examples=12)


def test_dead_letter_pages_on_postgresql(pg_ledger: Ledger) -> None:
    check_pages(pg_ledger)

"""Every PostgreSQL sink with mixed-case and schema-qualified table and marker names, through a crash
after the two-phase sinks' COMMIT PREPARED and the recovery that follows.

The sinks create their tables under quoted names; a lookup of the raw name folds it to lower case, so a
retried commit found no marker and took committed output for lost (the epoch stuck in COMMITTING), and
the plan check took an existing table for missing.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

from onceflow.config import Settings
from onceflow.errors import ConfigError
from onceflow.ledger import EpochStatus, Ledger
from onceflow.sinks._pg import PgTableConfig
from onceflow.sinks._pg_checks import check_table
from tests.faults import harness

pytestmark = [pytest.mark.integration, pytest.mark.faults]

RECORDS = 30


def ids_of(pg: Any, *name: str) -> list[int]:
    query = sql.SQL("SELECT id FROM {} ORDER BY id").format(sql.Identifier(*name))
    return [row[0] for row in pg.execute(query).fetchall()]


def test_mixed_case_and_schema_qualified_names_survive_a_crash_after_commit_prepared(
    settings: Settings, pg: Any, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    schema, table = f"Names_{tag}", f"Names_{tag}"
    scenario = harness.Scenario(
        "tests.faults.pg_names:NAMES",
        tmp_path,
        settings,
        env={"ONCEFLOW_FAULTS_SCHEMA": schema, "ONCEFLOW_FAULTS_TABLE": table},
    )
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    scenario.create_topics()
    try:
        scenario.workload.produce(settings.kafka_bootstrap, RECORDS)
        crashed = scenario.epoch("local", harness.Crash("participant_committed"))
        assert crashed.crashed, crashed.stderr
        recovered = scenario.run("recover")
        assert recovered.returncode == 0, recovered.output
        with Ledger.connect(scenario.env["ONCEFLOW_LEDGER_URL"]) as ledger:
            assert [e.status for e in ledger.epochs(scenario.spec.name)] == [EpochStatus.COMMITTED]
        scenario.must(scenario.epoch("local"))  # the next epoch plans and commits as well

        expected = list(range(RECORDS))
        assert ids_of(pg, schema, "TwoPhase") == expected
        assert ids_of(pg, f"{table}_TwoPhase") == expected
        assert ids_of(pg, schema, "Upsert") == expected
        assert sorted(set(ids_of(pg, schema, "Plain"))) == expected
        assert sorted(set(ids_of(pg, schema, "Wal"))) == expected
        markers = sql.SQL("SELECT count(*) FROM {}")
        assert pg.execute(markers.format(sql.Identifier(schema, "Markers"))).fetchone()[0] >= 1
        assert pg.execute(markers.format(sql.Identifier(f"{table}_Markers"))).fetchone()[0] >= 1
        prepared = pg.execute(
            "SELECT count(*) FROM pg_prepared_xacts WHERE starts_with(gid, %s)",
            [f"onceflow:{scenario.spec.name}:"],
        ).fetchone()[0]
        assert prepared == 0
    finally:
        for (gid,) in pg.execute(  # a prepared transaction left by a failure would block the drops
            "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s)",
            [f"onceflow:{scenario.spec.name}:"],
        ).fetchall():
            pg.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
        pg.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        for name in ("TwoPhase", "Markers"):
            pg.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(f"{table}_{name}")))
        scenario.drop(pg)


def test_the_plan_check_finds_an_existing_table_by_its_mixed_case_qualified_name(
    settings: Settings, pg: Any, tmp_path: Path
) -> None:
    """A table the sink may not create must be found where the sink would write (else the plan is
    refused with "does not exist"), and its columns checked there."""
    schema = f"Check_{uuid.uuid4().hex[:8]}"
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        pg.execute(sql.SQL("CREATE TABLE {} (id bigint, payload text)").format(sql.Identifier(schema, "Out")))
        table = PgTableConfig(settings.pg_dsn, f"{schema}.Out", (("id", "bigint"),), create_table=False)
        check_table(pg, "out", table)
        wrong = PgTableConfig(settings.pg_dsn, f"{schema}.Out", (("id", "text"),), create_table=False)
        with pytest.raises(ConfigError, match="column 'id' of table"):
            check_table(pg, "out", wrong)
    finally:
        pg.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))

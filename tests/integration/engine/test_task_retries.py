"""Spark task retries after a real SIGKILL; the driver rolls back the killed attempt's staging.

(Keyed state under faults is proven in tests/faults/test_state_faults.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from onceflow.config import Settings
from onceflow.engine.runner import run_epoch
from onceflow.faults import CRASH_AT_ENV, CRASH_STATE_ENV, crashed
from onceflow.ledger import EpochStatus, Ledger
from onceflow.pipeline import load_pipeline
from onceflow.protocol.planning import committers_for
from onceflow.sinks.files import read_committed_table
from onceflow.testing import coordinator_for_tests
from tests.integration.engine.data import ORDERS, orders, pg_ids, prepared_count, produce

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_spark_task_killed_after_its_pre_commit_is_retried_and_the_driver_rolls_its_staging_back(
    stack, settings, pg_connect, monkeypatch, tmp_path
) -> None:
    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], orders(0, 30))
    monkeypatch.setenv("ONCEFLOW_SPARK_MASTER", "local[2,3]")  # Spark may retry a failed task twice
    monkeypatch.setenv(CRASH_AT_ENV, "task_after_precommit")
    monkeypatch.setenv(CRASH_STATE_ENV, str(tmp_path / "crash"))
    # spark-submit: the crash point fires in executors that this process's environment reaches.
    outcome = run_epoch(ORDERS, Settings.from_env(), executor="submit")
    monkeypatch.delenv(CRASH_AT_ENV)
    assert crashed(tmp_path / "crash", "task_after_precommit")
    assert outcome.epoch.status == EpochStatus.COMMITTED

    expected = sorted(o["id"] for o in orders(0, 30) if o["amount"] > 0)
    assert pg_ids(pg_connect, stack["ONCEFLOW_TEST_TABLE"]) == expected
    files = read_committed_table(stack["ONCEFLOW_TEST_FILES"], "orders")
    assert sorted(files.column("id").to_pylist()) == expected

    # The killed attempt prepared a PostgreSQL transaction and never reported it: the slice's driver
    # rolled it back when it registered the retry that won, so recover finds nothing left.
    spec = load_pipeline(ORDERS)
    assert prepared_count(pg_connect, spec.name) == 0
    ledger = Ledger.connect(stack["ONCEFLOW_LEDGER_URL"])
    report = coordinator_for_tests(ledger, spec.name, committers_for(spec, Settings.from_env())).recover()
    ledger.close()
    assert report.orphans_aborted == ()
    assert pg_ids(pg_connect, stack["ONCEFLOW_TEST_TABLE"]) == expected
    assert list(Path(stack["ONCEFLOW_TEST_FILES"]).glob("_staging/**/*.parquet")) == []

"""Keyed state across committed and aborted epochs, and Spark task retries after a real SIGKILL."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from onceflow.config import Settings
from onceflow.engine.runner import ProcessFailed, run_epoch
from onceflow.engine.sinks import committers_for
from onceflow.faults import CRASH_AT_ENV, CRASH_STATE_ENV, crashed
from onceflow.ledger import EpochStatus, Ledger
from onceflow.pipeline import load_pipeline
from onceflow.sinks.files import read_committed_table
from onceflow.state import committed_state_files
from tests.integration.engine.data import ODD_EVEN, ORDERS, orders, pg_ids, prepared_count, produce

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def numbers(first: int, last: int) -> list[dict]:
    return [{"n": n} for n in range(first, last + 1)]


def sums(pg_connect, table: str) -> dict[str, int]:  # type: ignore[no-untyped-def]
    rows = pg_connect(autocommit=True).execute(f"SELECT parity, total FROM {table}").fetchall()
    return dict(rows)


def expected_sums(last: int) -> dict[str, int]:
    return {
        "odd": sum(n for n in range(1, last + 1) if n % 2),
        "even": sum(n for n in range(1, last + 1) if n % 2 == 0),
    }


def committed_state() -> dict[str, int]:
    spec = load_pipeline(ODD_EVEN)
    rows = [pq.read_table(f).to_pylist() for f in committed_state_files(spec)]
    return {r["parity"]: r["total"] for part in rows for r in part}


def test_running_sums_fold_each_epoch_once_and_an_aborted_epoch_leaves_the_state_alone(
    stack, settings, pg_connect, make_topic, monkeypatch, tmp_path
) -> None:
    """The odd/even example pipeline (examples/odd_even) on its own fresh topic and table."""
    topic = make_topic("numbers", partitions=3)
    suffix = topic.removeprefix("numbers")
    monkeypatch.setenv("ONCEFLOW_ODD_EVEN_SUFFIX", suffix)
    monkeypatch.delitem(sys.modules, "examples.odd_even.pipeline", raising=False)
    table = "parity_sums" + suffix.replace("-", "_")
    try:
        check_running_sums(topic, table, stack, settings, pg_connect, monkeypatch, tmp_path)
    finally:
        pg_connect(autocommit=True).execute(f"DROP TABLE IF EXISTS {table}")


def check_running_sums(topic, table, stack, settings, pg_connect, monkeypatch, tmp_path) -> None:
    produce(settings.kafka_bootstrap, topic, numbers(1, 20))
    assert run_epoch(ODD_EVEN, Settings.from_env()).epoch.status == EpochStatus.COMMITTED
    assert sums(pg_connect, table) == expected_sums(20) == committed_state()

    # Epoch 2: every task pre-commits its rows and its state, then the Spark driver is SIGKILLed.
    produce(settings.kafka_bootstrap, topic, numbers(21, 30))
    monkeypatch.setenv(CRASH_AT_ENV, "slice_after_precommits")
    monkeypatch.setenv(CRASH_STATE_ENV, str(tmp_path / "crash"))
    with pytest.raises(ProcessFailed):
        run_epoch(ODD_EVEN, Settings.from_env())
    assert crashed(tmp_path / "crash", "slice_after_precommits")
    monkeypatch.delenv(CRASH_AT_ENV)
    ledger = Ledger.connect(stack["ONCEFLOW_LEDGER_URL"])
    pipeline = load_pipeline(ODD_EVEN).name
    assert ledger.epoch(pipeline, 2).status == EpochStatus.ABORTED
    assert committed_state() == expected_sums(20)  # the staged state of epoch 2 was discarded

    # Epoch 3 replays 21..30 on top of epoch 1's state: each number is counted once.
    outcome = run_epoch(ODD_EVEN, Settings.from_env())
    assert outcome.epoch.number == 3 and outcome.epoch.status == EpochStatus.COMMITTED
    assert sums(pg_connect, table) == expected_sums(30) == committed_state()
    produce(settings.kafka_bootstrap, topic, numbers(31, 33))
    run_epoch(ODD_EVEN, Settings.from_env())
    assert sums(pg_connect, table) == expected_sums(33) == committed_state()
    # Superseded snapshots are compacted away; nothing is left staged.
    state_dir = Path(stack["ONCEFLOW_HOME"]) / "state" / pipeline
    kept = {p.parent.name for p in state_dir.glob("state/epoch=*/*.parquet")}
    assert sorted(kept) == ["epoch=3", "epoch=4"]  # epoch 3's snapshot is deleted when epoch 5 commits
    assert list(state_dir.glob("_staging/**/*.parquet")) == []
    ledger.close()


def test_a_spark_task_killed_after_staging_is_retried_and_the_sweeper_rolls_its_staging_back(
    stack, settings, pg_connect, monkeypatch, tmp_path
) -> None:
    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], orders(0, 30))
    monkeypatch.setenv("ONCEFLOW_SPARK_MASTER", "local[2,3]")  # Spark may retry a failed task twice
    monkeypatch.setenv(CRASH_AT_ENV, "task_after_stage")
    monkeypatch.setenv(CRASH_STATE_ENV, str(tmp_path / "crash"))
    outcome = run_epoch(ORDERS, Settings.from_env())
    monkeypatch.delenv(CRASH_AT_ENV)
    assert crashed(tmp_path / "crash", "task_after_stage")
    assert outcome.epoch.status == EpochStatus.COMMITTED

    expected = sorted(o["id"] for o in orders(0, 30) if o["amount"] > 0)
    assert pg_ids(pg_connect, stack["ONCEFLOW_TEST_TABLE"]) == expected
    files = read_committed_table(stack["ONCEFLOW_TEST_FILES"], "orders")
    assert sorted(files.column("id").to_pylist()) == expected

    # The killed attempt prepared a PostgreSQL transaction that no one owns: recover rolls it back.
    spec = load_pipeline(ORDERS)
    assert prepared_count(pg_connect, spec.name) == 1
    ledger = Ledger.connect(stack["ONCEFLOW_LEDGER_URL"])
    report = ledger.recover(spec.name, committers_for(spec))
    ledger.close()
    assert [(c.sink, c.epoch) for c in report.orphans_aborted] == [("orders_pg", 1)]
    assert prepared_count(pg_connect, spec.name) == 0
    assert pg_ids(pg_connect, stack["ONCEFLOW_TEST_TABLE"]) == expected
    assert list(Path(stack["ONCEFLOW_TEST_FILES"]).glob("_staging/**/*.parquet")) == []

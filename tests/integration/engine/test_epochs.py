"""Whole epochs through the engine on the real stack: Kafka -> Spark -> PostgreSQL 2PC and Parquet."""

from __future__ import annotations

import pytest

from onceflow.config import Settings
from onceflow.engine.runner import run_epoch
from onceflow.ledger import EpochStatus, Ledger
from tests.integration.engine.data import ORDERS as PIPELINE
from tests.integration.engine.data import dead_letter_codes, delivered_ids, orders, produce

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_two_epochs_deliver_each_good_record_once(stack, settings, pg_connect) -> None:
    first = orders(0, 40)
    produce(
        settings.kafka_bootstrap,
        stack["ONCEFLOW_TEST_TOPIC"],
        first,
        abort=orders(1000, 5),
        bad=[b"{not json", b'{"id": "x", "amount": 1.0, "customer": "c"}', b"\xff\xfe"],
    )
    outcome = run_epoch(PIPELINE, Settings.from_env())
    assert outcome.epoch.status == EpochStatus.COMMITTED
    expected = sorted(o["id"] for o in first if o["amount"] > 0)
    assert delivered_ids(pg_connect, stack) == (expected, expected)
    assert dead_letter_codes(stack) == ["malformed_json", "not_utf8", "wrong_type"]

    second = orders(40, 25)
    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], second)
    outcome = run_epoch(PIPELINE, Settings.from_env())
    assert outcome.epoch.number == 2 and outcome.epoch.status == EpochStatus.COMMITTED
    expected = sorted(expected + [o["id"] for o in second if o["amount"] > 0])
    assert delivered_ids(pg_connect, stack) == (expected, expected)

    # Epoch 2 started exactly where epoch 1 ended, partition by partition.
    ledger = Ledger.connect(stack["ONCEFLOW_LEDGER_URL"])
    epochs = ledger.epochs(stack["ONCEFLOW_TEST_PIPELINE"])
    ends = {(r.topic, r.partition): r.until_offset for r in epochs[0].ranges}
    assert {(r.topic, r.partition): r.from_offset for r in epochs[1].ranges} == ends
    # Nothing is left prepared or staged.
    prepared = (
        pg_connect(autocommit=True)
        .execute(
            "SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE %s",
            (f"onceflow:{stack['ONCEFLOW_TEST_PIPELINE']}:%",),
        )
        .fetchone()[0]
    )
    assert prepared == 0
    ledger.close()


def test_cli_commit_is_idempotent_and_abort_is_refused_after_commit(stack, settings, pg_connect) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], orders(0, 10))
    outcome = run_epoch(PIPELINE, Settings.from_env())
    assert outcome.epoch.status == EpochStatus.COMMITTED
    expected = sorted(o["id"] for o in orders(0, 10) if o["amount"] > 0)
    assert delivered_ids(pg_connect, stack) == (expected, expected)
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "ONCEFLOW_PIPELINES": PIPELINE, "PYTHONPATH": root}
    onceflow = str(Path(sys.executable).parent / "onceflow")
    pipeline, number = stack["ONCEFLOW_TEST_PIPELINE"], str(outcome.epoch.number)

    again = subprocess.run([onceflow, "commit", pipeline, number], env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    # Idempotent: the second commit delivered nothing again, to either sink.
    assert delivered_ids(pg_connect, stack) == (expected, expected)
    refused = subprocess.run([onceflow, "abort", pipeline, number], env=env, capture_output=True, text=True)
    assert refused.returncode == 3, refused.stderr
    assert "COMMITTED" in refused.stderr or "committed" in refused.stderr
    recovered = subprocess.run([onceflow, "recover", pipeline], env=env, capture_output=True, text=True)
    assert recovered.returncode == 0, recovered.stderr
    assert "nothing in flight" in recovered.stdout

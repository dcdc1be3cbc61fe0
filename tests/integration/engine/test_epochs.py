"""Whole epochs through the engine on the real stack: Kafka -> Spark -> PostgreSQL 2PC and Parquet."""

from __future__ import annotations

import json
import sys
import uuid

import pytest
from confluent_kafka import Producer

from onceflow.config import Settings
from onceflow.engine.runner import run_epoch
from onceflow.ledger import EpochStatus, Ledger
from onceflow.sinks.files import read_committed_table

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PIPELINE = "tests.integration.engine.pipelines:ORDERS"


@pytest.fixture
def stack(settings, make_topic, pg_connect, tmp_path, monkeypatch):
    """A unique topic (3 partitions), table, files root and SQLite ledger, exported for the Spark job."""
    suffix = uuid.uuid4().hex[:8]
    topic = make_topic("engine", partitions=3)
    env = {
        "ONCEFLOW_TEST_PIPELINE": f"engine-{suffix}",
        "ONCEFLOW_TEST_TOPIC": topic,
        "ONCEFLOW_TEST_TABLE": f"engine_orders_{suffix}",
        "ONCEFLOW_TEST_FILES": str(tmp_path / "files"),
        "ONCEFLOW_LEDGER_URL": f"sqlite:///{tmp_path / 'ledger.db'}",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    # The spec module reads these variables at import: make this process import it afresh too.
    monkeypatch.delitem(sys.modules, PIPELINE.partition(":")[0], raising=False)
    ledger = Ledger.connect(env["ONCEFLOW_LEDGER_URL"], check=False)
    ledger.upgrade()
    ledger.close()
    yield env
    pg_connect(autocommit=True).execute(f"DROP TABLE IF EXISTS {env['ONCEFLOW_TEST_TABLE']}")


def _produce(
    bootstrap: str, topic: str, orders: list[dict], *, abort: list[dict] = (), bad: list[bytes] = ()
):
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": uuid.uuid4().hex})
    producer.init_transactions(30)
    producer.begin_transaction()
    for order in orders:
        producer.produce(topic, key=str(order["id"]).encode(), value=json.dumps(order).encode())
    for raw in bad:
        producer.produce(topic, key=b"bad", value=raw)
    producer.commit_transaction(30)
    if abort:
        producer.begin_transaction()
        for order in abort:
            producer.produce(topic, key=str(order["id"]).encode(), value=json.dumps(order).encode())
        producer.flush(30)
        producer.abort_transaction(30)


def _orders(start: int, count: int) -> list[dict]:
    return [{"id": i, "amount": float(i % 5), "customer": f"c{i % 3}"} for i in range(start, start + count)]


def _pg_ids(pg_connect, table: str) -> list[int]:
    rows = pg_connect(autocommit=True).execute(f"SELECT id FROM {table} ORDER BY id").fetchall()
    return [r[0] for r in rows]


def test_two_epochs_deliver_each_good_record_once(stack, settings, pg_connect) -> None:
    first = _orders(0, 40)
    _produce(
        settings.kafka_bootstrap,
        stack["ONCEFLOW_TEST_TOPIC"],
        first,
        abort=_orders(1000, 5),
        bad=[b"{not json", b'{"id": "x", "amount": 1.0, "customer": "c"}', b"\xff\xfe"],
    )
    outcome = run_epoch(PIPELINE, Settings.from_env())
    assert outcome.epoch.status == EpochStatus.COMMITTED
    expected = sorted(o["id"] for o in first if o["amount"] > 0)
    assert _pg_ids(pg_connect, stack["ONCEFLOW_TEST_TABLE"]) == expected
    files = read_committed_table(stack["ONCEFLOW_TEST_FILES"], "orders")
    assert sorted(files.column("id").to_pylist()) == expected

    ledger = Ledger.connect(stack["ONCEFLOW_LEDGER_URL"])
    letters = ledger.dead_letters(stack["ONCEFLOW_TEST_PIPELINE"])
    assert sorted(d.letter.reason.split(":")[0] for d in letters) == [
        "malformed_json",
        "not_utf8",
        "wrong_type",
    ]

    second = _orders(40, 25)
    _produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], second)
    outcome = run_epoch(PIPELINE, Settings.from_env())
    assert outcome.epoch.number == 2 and outcome.epoch.status == EpochStatus.COMMITTED
    expected += sorted(o["id"] for o in second if o["amount"] > 0)
    assert _pg_ids(pg_connect, stack["ONCEFLOW_TEST_TABLE"]) == sorted(expected)
    files = read_committed_table(stack["ONCEFLOW_TEST_FILES"], "orders")
    assert sorted(files.column("id").to_pylist()) == sorted(expected)

    # Epoch 2 started exactly where epoch 1 ended, partition by partition.
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


def test_cli_commit_is_idempotent_and_abort_is_refused_after_commit(stack, settings) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    _produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], _orders(0, 10))
    outcome = run_epoch(PIPELINE, Settings.from_env())
    assert outcome.epoch.status == EpochStatus.COMMITTED
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "ONCEFLOW_PIPELINES": PIPELINE, "PYTHONPATH": root}
    onceflow = str(Path(sys.executable).parent / "onceflow")
    pipeline, number = stack["ONCEFLOW_TEST_PIPELINE"], str(outcome.epoch.number)

    again = subprocess.run([onceflow, "commit", pipeline, number], env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    refused = subprocess.run([onceflow, "abort", pipeline, number], env=env, capture_output=True, text=True)
    assert refused.returncode == 3, refused.stderr
    assert "COMMITTED" in refused.stderr or "committed" in refused.stderr
    recovered = subprocess.run([onceflow, "recover", pipeline], env=env, capture_output=True, text=True)
    assert recovered.returncode == 0, recovered.stderr
    assert "nothing in flight" in recovered.stdout

"""A reader schema that gains fields while the pipeline runs, on the real stack: epochs keep committing,
PostgreSQL, Iceberg and the files sink gain the new columns before the epoch that first writes them, a
crash on either side of the change leaves tables that the old and the new code both finish, and a
rename is refused at plan time in one line naming the fields."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import replace
from typing import Any

import pytest
from confluent_kafka import Producer

from onceflow.config import Settings
from onceflow.engine.runner import run_epoch
from onceflow.errors import ConfigError
from onceflow.faults import CRASH_AT_ENV, CRASH_STATE_ENV
from onceflow.ledger import EpochStatus, Ledger
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.sinks.files import read_committed_table

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MODULE = "tests.integration.engine.test_schema_evolution"
V1_FIELDS: dict[str, Any] = {"id": "int", "sku": "string", "items": [{"sku": "string", "qty": "int"}]}
V2_FIELDS: dict[str, Any] = {
    "id": "int",
    "sku": "string",
    "items": [{"sku": "string", "qty": "int", "note": "string?"}],
    "coupon": "string?",
}


def _pipeline(fields: dict[str, Any], pg_columns: dict[str, str]) -> Pipeline:
    suffix = os.environ.get("ONCEFLOW_TEST_TABLE", "engine_test")
    return Pipeline(
        name=f"{os.environ.get('ONCEFLOW_TEST_PIPELINE', 'engine-test')}-evolving",
        source=KafkaSource(topics=(os.environ.get("ONCEFLOW_TEST_TOPIC", "engine-test"),)),
        format=JsonFormat(schema=fields),
        sinks=(
            SinkSpec("pg", "postgres_2pc", {"table": suffix, "columns": pg_columns}),
            SinkSpec("lake", "iceberg", {"table": f"evolving.{suffix}"}),  # the decoded rows' columns
            SinkSpec(
                "files", "files", {"root": os.environ.get("ONCEFLOW_TEST_FILES", "/tmp/x"), "table": "t"}
            ),
        ),
        max_records_per_task=6,
    )


def __getattr__(name: str) -> Pipeline:
    """The pipeline's versions, built when asked for: the test's names are set only then."""
    v1 = _pipeline(V1_FIELDS, {"id": "bigint", "sku": "text", "items": "jsonb"})
    v2 = _pipeline(V2_FIELDS, {"id": "bigint", "sku": "text", "items": "jsonb", "coupon": "text"})
    if name == "V1":
        return v1
    if name == "V2":
        return v2
    if name == "RENAMED":  # coupon renamed voucher
        fields = {("voucher" if k == "coupon" else k): v for k, v in V2_FIELDS.items()}
        assert isinstance(v2.format, JsonFormat)
        return replace(v2, format=JsonFormat(schema=fields))
    raise AttributeError(name)


@pytest.fixture(autouse=True)
def _fresh_module(stack, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delitem(sys.modules, MODULE, raising=False)


def _docs(first: int, n: int, v2: bool) -> list[dict[str, Any]]:
    docs = []
    for i in range(first, first + n):
        items = [{"sku": f"i{i}-{j}", "qty": j} for j in range(i % 3)]
        doc: dict[str, Any] = {"id": i, "sku": f"s{i}", "items": items}
        if v2:
            doc["coupon"] = None if i % 4 == 0 else f"c{i}"
            for item in items:
                item["note"] = f"n{item['qty']}"
        docs.append(doc)
    return docs


def _produce(bootstrap: str, topic: str, docs: list[dict[str, Any]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": uuid.uuid4().hex})
    producer.init_transactions(30)
    producer.begin_transaction()
    for doc in docs:
        producer.produce(topic, key=str(doc["id"]).encode(), value=json.dumps(doc).encode())
    producer.commit_transaction(30)


def _crash(version: str, point: str, tmp: Any) -> None:
    """One epoch of ``version`` in a child process that SIGKILLs itself at ``point``."""
    state = tmp / f"crash-{version}-{point}"
    killed = subprocess.run(
        [sys.executable, "-m", "tests.faults.driver", "epoch", f"{MODULE}:{version}"],
        env={**os.environ, CRASH_AT_ENV: point, CRASH_STATE_ENV: str(state)},
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]


@pytest.mark.timeout(600)
def test_a_new_nullable_field_reaches_every_sink_mid_run_and_a_rename_is_refused(  # type: ignore[no-untyped-def]
    stack, settings, pg_connect, tmp_path
) -> None:
    try:
        _run_versions(stack, settings, pg_connect, tmp_path)
    finally:  # a failure mid-way leaves prepared transactions, which would hold the table's drop
        with pg_connect(autocommit=True) as conn:
            pipeline = __getattr__("V1").name
            for (gid,) in conn.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", [f"%{pipeline}%"]
            ):
                conn.execute(f"ROLLBACK PREPARED '{gid}'")


def _run_versions(stack, settings, pg_connect, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The whole run: v1 epochs, crashes on either side of the change, v2 epochs, the refused rename,
    then every sink read back."""
    topic, table = stack["ONCEFLOW_TEST_TOPIC"], stack["ONCEFLOW_TEST_TABLE"]
    v1_docs = _docs(0, 20, v2=False)
    v2_docs = _docs(100, 20, v2=True)
    # Epoch 1 reads v1 records with v1.
    _produce(settings.kafka_bootstrap, topic, v1_docs[:10])
    assert run_epoch(f"{MODULE}:V1", Settings.from_env()).epoch.status == EpochStatus.COMMITTED
    # Epoch 2 (v1) dies once its commit is decided: PostgreSQL holds its rows prepared.
    _produce(settings.kafka_bootstrap, topic, v1_docs[10:])
    _crash("V1", "after_decision", tmp_path)
    # v2 is deployed. Its first run commits epoch 2 in recovery (rows written by v1), plans epoch 3 with
    # the new fields, so that the sinks add them, and dies between that change and the commit.
    _produce(settings.kafka_bootstrap, topic, v2_docs[:10])
    _crash("V2", "slice_after_precommits", tmp_path)
    with pg_connect(autocommit=True) as conn:
        columns = [r[0] for r in conn.execute(f"SELECT * FROM {table} LIMIT 0").description or []]
        assert sorted(columns[:-1]) == ["id", "items", "sku"] and columns[-1] == "coupon"  # added at plan
    # Going back to v1 now: it rolls back epoch 3 in recovery, on the wider tables, then refuses to plan
    # without the field the last epoch read, in one line naming it.
    with pytest.raises(
        ConfigError, match=r"refused: items\[\]\.note \(string\?\) is gone .*; coupon \(string\?\) is gone"
    ) as gone:
        run_epoch(f"{MODULE}:V1", Settings.from_env())
    assert "\n" not in str(gone.value)
    # v2 again: epoch 4 reads epoch 3's records and the rest.
    _produce(settings.kafka_bootstrap, topic, v2_docs[10:])
    outcome = run_epoch(f"{MODULE}:V2", Settings.from_env())
    assert outcome.epoch.number == 4 and outcome.epoch.status == EpochStatus.COMMITTED
    with Ledger.connect(stack["ONCEFLOW_LEDGER_URL"]) as ledger:
        name = ledger.pipelines()[0]
        done = [EpochStatus.COMMITTED, EpochStatus.COMMITTED, EpochStatus.ABORTED, EpochStatus.COMMITTED]
        assert [e.status for e in ledger.epochs(name)] == done
        recorded = ledger.reader_schema(name)
    assert recorded is not None and "coupon:string?" in recorded and "note:string?" in recorded

    # A rename is refused before anything is planned, in one line naming both fields.
    _produce(settings.kafka_bootstrap, topic, _docs(200, 3, v2=True))
    with pytest.raises(ConfigError) as refused:
        run_epoch(f"{MODULE}:RENAMED", Settings.from_env())
    message = str(refused.value)
    assert "coupon (string?) is gone from the schema" in message and "voucher (string?) is new" not in message
    assert "\n" not in message
    with Ledger.connect(stack["ONCEFLOW_LEDGER_URL"]) as ledger:
        assert len(ledger.epochs(name)) == 4

    want = {d["id"]: d for d in [*v1_docs, *v2_docs]}
    # PostgreSQL: every record once; the v1 records' coupon is null.
    with pg_connect(autocommit=True) as conn:
        rows = conn.execute(f"SELECT id, sku, items, coupon FROM {table} ORDER BY id").fetchall()
    assert [r[0] for r in rows] == sorted(want)
    for id_, sku, items, coupon in rows:
        assert (sku, items, coupon) == (want[id_]["sku"], want[id_]["items"], want[id_].get("coupon"))

    # Iceberg (pyiceberg): one table, the new fields optional; one snapshot per committed epoch.
    from onceflow.sinks import iceberg
    from onceflow.sinks.iceberg import table as tables

    sink = next(s for s in __getattr__("V2").sinks if s.name == "lake")
    config = iceberg.IcebergConfig.from_mapping(iceberg.SINK_KIND.config_for(sink, Settings.from_env()))
    lake = tables.load(config.open_catalog(), config.table)
    assert lake is not None
    schema = lake.schema()
    assert not schema.find_field("coupon").required and not schema.find_field("items.element.note").required
    assert len([s for s in lake.snapshots() if s.summary and s.summary.get("onceflow.epoch")]) == 3
    got = {r["id"]: r for r in lake.scan().to_arrow().to_pylist()}
    assert sorted(got) == sorted(want)
    for id_, doc in want.items():
        assert got[id_]["coupon"] == doc.get("coupon")
        assert [i.get("note") for i in got[id_]["items"]] == [i.get("note") for i in doc["items"]]

    # Files: old files narrower, new ones wider, read as one table by the commit log.
    files = read_committed_table(stack["ONCEFLOW_TEST_FILES"], "t").to_pylist()
    assert sorted(r["id"] for r in files) == sorted(want)
    assert {r["id"]: r["coupon"] for r in files} == {i: d.get("coupon") for i, d in want.items()}

"""Debezium's PostgreSQL connector on the stack's Kafka Connect: real change events in Kafka.

One source table, three connectors on it (each with its own replication slot, publication and topics):
JSON with schemas (with transaction metadata), JSON without schemas, and Avro through the stack's schema
registry. After the initial snapshot, one series of changes: an insert, an update, a delete, a
transaction of two statements, ADD COLUMN followed by an insert that fills the new column, and a TRUNCATE.
Each serialization must carry the same events, in order, in Debezium's envelope: ``before``, ``after``,
``op`` (r, c, u, d, t), ``source`` with the LSN and the transaction id, a tombstone after each delete;
with transaction metadata, BEGIN and END events on the transaction topic and a ``transaction`` block in
each streamed envelope.

The events become the samples in tests/data/debezium/ (one of each kind per serialization) when that
folder has none or ONCEFLOW_CAPTURE_DEBEZIUM_SAMPLES=1; otherwise each fresh event must have the shape
(envelope fields, op) of its saved sample, so that the samples stay what the connector writes.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from onceflow.config import Settings
from tests.cdc import (
    SERIALIZATIONS,
    CdcConnector,
    Change,
    ChangeReader,
    register_postgres_connector,
    require_connect,
)
from tests.cdc import (
    source_table as cdc_source_table,
)

pytestmark = pytest.mark.integration

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "debezium"
CAPTURE = os.environ.get("ONCEFLOW_CAPTURE_DEBEZIUM_SAMPLES") == "1"
# What the changes below give on every change topic, in order (None: the tombstone after a delete).
STREAMED = ["c", "u", "d", None, "c", "u", "c", "t"]
SAMPLE_KINDS = {
    "read": 0,  # index into the snapshot's records
    "create": 0,  # indexes into the streamed records
    "update": 1,
    "delete": 2,
    "tombstone": 3,
    "create_after_add_column": 6,
    "truncate": 7,
}


@pytest.fixture(scope="module")
def connect(settings: Settings) -> str:
    return require_connect(settings)


@pytest.fixture
def source_table(settings: Settings) -> Iterator[str]:
    with cdc_source_table(settings.pg_dsn, "cdc_src", "120.00") as table:
        yield table


@pytest.fixture
def connectors(
    connect: str, settings: Settings, source_table: str, kafka_admin: Any, schema_registry: Any
) -> Iterator[dict[str, CdcConnector]]:
    """The three connectors on the table; the Avro one needs the registry (``schema_registry`` skips,
    saying why, only where no Java 21+ can run it, as for the other registry tests)."""
    registry = settings.schema_registry_url
    registered: dict[str, CdcConnector] = {}
    try:
        for serialization in SERIALIZATIONS:
            registered[serialization] = register_postgres_connector(
                settings.pg_dsn,
                [f"public.{source_table}"],
                serialization,
                registry_url=registry,
                transaction_metadata=serialization == "json",
            )
        for connector in registered.values():
            connector.wait_running()
        yield registered
    finally:
        topics = []
        for connector in registered.values():
            connector.delete()
            topics += [connector.topic(source_table), connector.transaction_topic]
        existing = set(kafka_admin.list_topics(timeout=10).topics)
        doomed = [t for t in topics if t in existing]
        if doomed:
            for future in kafka_admin.delete_topics(doomed).values():
                future.result(timeout=30)


def _change_table(dsn: str, table: str) -> None:
    """The streamed changes, one transaction per step."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {table} (id, name, qty, price) VALUES (3, 'eve', 7, 0.99)")
        conn.execute(f"UPDATE {table} SET qty = 4, price = 10.25, updated_at = now() WHERE id = 1")
        conn.execute(f"DELETE FROM {table} WHERE id = 2")
        with conn.transaction():
            conn.execute(f"INSERT INTO {table} (id, name, qty, price) VALUES (5, 'kim', 2, 5.00)")
            conn.execute(f"UPDATE {table} SET name = 'eve2' WHERE id = 3")
        conn.execute(f"ALTER TABLE {table} ADD COLUMN note text")
        conn.execute(f"INSERT INTO {table} (id, name, qty, price, note) VALUES (6, 'lou', 1, 1.00, 'added')")
        conn.execute(f"TRUNCATE {table}")


def _op(change: Change) -> str | None:
    envelope = change.envelope
    return None if envelope is None else envelope["op"]


def _row_field(row: dict[str, Any] | None, name: str) -> Any:
    """A column of a before/after row; Avro's optional columns come through fastavro as plain values."""
    assert row is not None
    return row[name]


def test_debezium_events_in_each_serialization(
    connectors: dict[str, CdcConnector], source_table: str, settings: Settings
) -> None:
    readers = {
        serialization: ChangeReader(
            settings.kafka_bootstrap,
            connector.topic(source_table),
            serialization,
            settings.schema_registry_url,
        )
        for serialization, connector in connectors.items()
    }
    try:
        # The snapshot: both rows as "r" events, the last one marked as the snapshot's last.
        snapshots = {s: reader.read(2, timeout_s=90) for s, reader in readers.items()}
        for serialization, changes in snapshots.items():
            envelopes = [c.envelope for c in changes]
            assert [e and e["op"] for e in envelopes] == ["r", "r"], serialization
            assert sorted(_row_field(e and e["after"], "id") for e in envelopes) == [1, 2]
            assert all(e and e["before"] is None for e in envelopes)
            assert envelopes[-1] and envelopes[-1]["source"]["snapshot"] == "last", serialization

        _change_table(settings.pg_dsn, source_table)

        streamed = {s: reader.read(len(STREAMED), timeout_s=90) for s, reader in readers.items()}
        for serialization, changes in streamed.items():
            _check_streamed(serialization, changes, source_table)
            assert readers[serialization].nothing_more(), f"{serialization}: more records than expected"

        # The same rows whatever the serialization.
        keys = {s: [_key_id(c) for c in changes] for s, changes in streamed.items()}
        assert keys["json"] == keys["json-schemaless"] == keys["avro"] == [3, 1, 2, 2, 5, 3, 6, None]

        # Avro: every record framed with an id the registry's Confluent-compatible API resolves, and the
        # value schema changed with ADD COLUMN (a new id for the new column).
        avro = streamed["avro"]
        assert all(isinstance(c.schema_ids[1], int) for c in avro if c.raw_value is not None)
        added = SAMPLE_KINDS["create_after_add_column"]
        assert avro[added].schema_ids[1] != avro[0].schema_ids[1]
        # ... under the subjects of the topic-name strategy, as the Confluent-compatible API lists them.
        from onceflow.decoding.schema_registry import HttpSchemaRegistry

        assert settings.schema_registry_url
        registry = HttpSchemaRegistry(settings.schema_registry_url, timeout_s=10)
        topic = connectors["avro"].topic(source_table)
        assert registry.latest(f"{topic}-value").id == avro[added].schema_ids[1]
        assert registry.latest(f"{topic}-key").id == avro[0].schema_ids[0]
        transactions = _check_transaction_topic(connectors["json"], settings, streamed["json"])
        _samples(snapshots, streamed, transactions, readers)
    finally:
        for reader in readers.values():
            reader.close()


def _key_id(change: Change) -> int | None:
    key = change.key
    if key is None:
        return None
    if isinstance(key, dict) and set(key) == {"schema", "payload"}:
        key = key["payload"]
    return int(key["id"])


def _check_streamed(serialization: str, changes: list[Change], table: str) -> None:
    ops = [_op(c) for c in changes]
    assert ops == STREAMED, f"{serialization}: {ops}"
    envelopes = [c.envelope for c in changes]
    insert, update, delete, tombstone, tx_insert, tx_update, added, truncate = envelopes
    assert tombstone is None and changes[3].raw_value is None and changes[3].key is not None
    assert insert and insert["before"] is None and _row_field(insert["after"], "name") == "eve"
    assert update and _row_field(update["before"], "qty") == 3 and _row_field(update["after"], "qty") == 4
    assert delete and delete["after"] is None and _row_field(delete["before"], "name") == "ben"
    assert tx_insert and tx_update and tx_insert["source"]["txId"] == tx_update["source"]["txId"]
    assert added and _row_field(added["after"], "note") == "added"
    assert "note" not in (insert["after"] or {})
    assert truncate and truncate["before"] is None and truncate["after"] is None
    assert changes[-1].key is None
    for envelope in (e for e in envelopes if e is not None):
        source = envelope["source"]
        assert source["connector"] == "postgresql" and source["table"] == table
        assert isinstance(source["lsn"], int) and isinstance(source["txId"], int)
        assert source["snapshot"] in ("false", False, None)
    # LSNs grow along the stream; each step but the two-statement one is its own transaction.
    lsns = [e["source"]["lsn"] for e in envelopes if e is not None]
    assert lsns == sorted(lsns)
    tx_ids = [e["source"]["txId"] for e in envelopes if e is not None]
    assert len(set(tx_ids)) == len(tx_ids) - 1


def _check_transaction_topic(
    connector: CdcConnector, settings: Settings, changes: list[Change]
) -> list[Change]:
    """BEGIN and END events for each streamed transaction, in order; each data event names its
    transaction, and END counts that transaction's events.

    Debezium 3.6's PostgreSQL connector writes a transaction's id as ``txId:LSN`` with the LSN of where
    it is written: BEGIN has the first event's, each event its own, END the commit's. The transaction is
    the ``txId`` part (as ``source.txId`` has it), so that is what groups them here, as a decoder must."""
    by_tx: dict[int, list[dict[str, Any]]] = {}
    for change in changes:
        envelope = change.envelope
        if envelope is None:
            continue
        block = envelope["transaction"]
        assert block is not None, envelope["op"]
        tx_id, _, lsn = block["id"].partition(":")
        assert int(tx_id) == envelope["source"]["txId"] and int(lsn) == envelope["source"]["lsn"]
        by_tx.setdefault(int(tx_id), []).append(block)
    reader = ChangeReader(settings.kafka_bootstrap, connector.transaction_topic, "json")
    try:
        events = reader.read(2 * len(by_tx), timeout_s=60)
        assert reader.nothing_more(), "more transaction events than transactions"
    finally:
        reader.close()
    markers = [e.envelope for e in events]
    assert all(m is not None for m in markers)
    statuses = [(m["status"], int(m["id"].partition(":")[0])) for m in markers if m]
    assert statuses == [(status, tx) for tx in by_tx for status in ("BEGIN", "END")]
    for marker in markers:
        assert marker is not None
        blocks = by_tx[int(marker["id"].partition(":")[0])]
        if marker["status"] == "BEGIN":
            assert marker["id"] == blocks[0]["id"] and marker["event_count"] is None
            continue
        assert marker["event_count"] == len(blocks)
        [collection] = marker["data_collections"]
        assert collection["event_count"] == len(blocks)
        assert [b["total_order"] for b in blocks] == list(range(1, len(blocks) + 1))
    assert max(len(b) for b in by_tx.values()) == 2  # the two-statement transaction
    return events


# ---------------------------------------------------------------------------------------------------
# The samples: tests/data/debezium/<serialization>/<kind>.{key,value}.{json,bin}, Avro's writer schemas
# beside them with a registry.json manifest (a folder onceflow's FolderSchemaRegistry reads).


def _samples(
    snapshots: dict[str, list[Change]],
    streamed: dict[str, list[Change]],
    transactions: list[Change],
    readers: dict[str, ChangeReader],
) -> None:
    for serialization in SERIALIZATIONS:
        chosen = {
            kind: (snapshots if kind == "read" else streamed)[serialization][index]
            for kind, index in SAMPLE_KINDS.items()
        }
        if serialization == "json":
            chosen["transaction_begin"] = transactions[0]
            chosen["transaction_end"] = transactions[1]
        folder = SAMPLES / serialization
        if CAPTURE or not folder.exists():
            _write_samples(folder, serialization, chosen, readers[serialization])
        else:
            for kind, change in chosen.items():
                _check_sample(folder, serialization, kind, change)


def _sample_files(folder: Path, serialization: str, kind: str) -> tuple[Path, Path]:
    suffix = "bin" if serialization == "avro" else "json"
    return folder / f"{kind}.key.{suffix}", folder / f"{kind}.value.{suffix}"


def _write_samples(folder: Path, serialization: str, chosen: dict[str, Change], reader: ChangeReader) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for kind, change in chosen.items():
        files = _sample_files(folder, serialization, kind)
        for path, raw in zip(files, (change.raw_key, change.raw_value), strict=True):
            path.unlink(missing_ok=True)
            if raw is not None:  # a missing file is a null key or value (a tombstone, a truncate's key)
                path.write_bytes(raw)
    if serialization == "avro":
        used = {i for change in chosen.values() for i in change.schema_ids if i is not None}
        entries = []
        for schema_id in sorted(used):
            schema = json.loads(reader.writer_schemas[schema_id])
            file = f"schema-{schema_id}.avsc"
            (folder / file).write_text(json.dumps(schema, indent=2) + "\n")
            side = "key" if schema.get("name", "").rpartition(".")[2] == "Key" else "value"
            entries.append({"id": schema_id, "subject": f"{reader.topic}-{side}", "version": 1, "file": file})
        for entry in entries:  # versions in id order within a subject
            same = [e for e in entries if e["subject"] == entry["subject"]]
            entry["version"] = sorted(e["id"] for e in same).index(entry["id"]) + 1
        (folder / "registry.json").write_text(json.dumps({"schemas": entries}, indent=2) + "\n")
        decoded = {kind: _jsonable(change.value) for kind, change in chosen.items()}
        (folder / "decoded.json").write_text(json.dumps(decoded, indent=2, sort_keys=True) + "\n")


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode()}
    if isinstance(value, decimal.Decimal):
        return {"decimal": str(value)}
    if isinstance(value, datetime.date | datetime.time):
        return {"iso": value.isoformat()}
    return value


def _shape(change: Change) -> tuple[Any, ...]:
    envelope = change.envelope
    if envelope is None:
        return (None,)
    if "status" in envelope:
        return ("status", envelope["status"], tuple(sorted(envelope)))
    after = envelope.get("after") or envelope.get("before") or {}
    return (envelope["op"], tuple(sorted(envelope)), tuple(sorted(after)), tuple(sorted(envelope["source"])))


def _check_sample(folder: Path, serialization: str, kind: str, change: Change) -> None:
    key_file, value_file = _sample_files(folder, serialization, kind)
    assert value_file.exists() == (change.raw_value is not None), f"{value_file}: sample and event disagree"
    if serialization == "avro":
        # Raw Avro cannot be read without its schema: the decoded copy holds the sample's shape.
        decoded = json.loads((folder / "decoded.json").read_text())[kind]
        saved = Change(None, None, None, decoded)
    else:
        raw = value_file.read_bytes() if value_file.exists() else None
        saved = Change(None, raw, None, json.loads(raw) if raw else None)
    assert _shape(saved) == _shape(change), f"{serialization} {kind}: the connector's event changed shape"
    assert key_file.exists() == (change.raw_key is not None), f"{key_file}: sample and event disagree"

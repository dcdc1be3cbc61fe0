"""Avro records in the schema registry wire format, from the real Kafka through epochs of the local
executor (and of the warm Spark runtime, whose JVM decodes what it can prove): rows of two writer schema
versions, every bad record one dead letter with its code, and a registry that does not answer failing
the plan (which reads the subject's schema) or aborting an epoch mid-decode, whose range the next epoch
then delivers.

The writer schemas come from a folder (`onceflow.decoding.schema_registry.FolderSchemaRegistry`), the registry
the test can hold still; the HTTP client is the same interface.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import socket
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer
from fastavro import parse_schema

from onceflow.config import Settings
from onceflow.decoding.records import KafkaRecord, RowDecoder
from onceflow.decoding.schema_registry import FolderSchemaRegistry, RegistryUnavailable, wire_value
from onceflow.engine.executors import Executor
from onceflow.engine.runner import ProcessFailed, run_epoch
from onceflow.ledger import EpochStatus, Ledger
from onceflow.pipeline import AvroFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.sinks.files import read_committed_table

pytestmark = pytest.mark.integration

AMOUNT = {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}
AT = {"type": "long", "logicalType": "timestamp-millis"}
V1 = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "int"}, {"name": "amount", "type": AMOUNT}, {"name": "at", "type": AT}],
}
# Version 2 widens id and adds a nullable coupon with a default: records of version 1 still read.
V2 = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": AMOUNT},
        {"name": "at", "type": AT},
        {"name": "coupon", "type": ["null", "string"], "default": None},
    ],
}
# A writer the reader cannot resolve (id as text), and one whose amount may be null.
TEXT_ID = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "string"}]}
NULLABLE = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": ["null", AMOUNT]},
        {"name": "at", "type": AT},
    ],
}
# What the Kafka sink writes: the order without its coupon, and the partition it came from.
OUT = {
    "type": "record",
    "name": "OrderOut",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": AMOUNT},
        {"name": "_partition", "type": "int"},
    ],
}
SCHEMAS = {1: V1, 2: V2, 3: TEXT_ID, 4: NULLABLE, 5: OUT}
START = dt.datetime(2026, 11, 25, 12, 0, tzinfo=dt.UTC)

PIPELINE: Pipeline  # set by the test, found by the runner as f"{__name__}:PIPELINE"


def framed(schema_id: int, record: dict[str, Any]) -> bytes:
    return wire_value(schema_id, parse_schema(SCHEMAS[schema_id]), record)


def order(i: int) -> dict[str, Any]:
    return {"id": i, "amount": decimal.Decimal(i) / 4, "at": START + dt.timedelta(seconds=i)}


def schema_folder(folder: Path) -> str:
    folder.mkdir()
    entries = []
    for schema_id, schema in SCHEMAS.items():
        (folder / f"v{schema_id}.avsc").write_text(json.dumps(schema))
        subject = {1: "orders-value", 2: "orders-value", 5: "orders-out-value"}.get(schema_id, "other-value")
        entries.append(
            {"id": schema_id, "subject": subject, "version": schema_id, "file": f"v{schema_id}.avsc"}
        )
    (folder / "registry.json").write_text(json.dumps({"schemas": entries}))
    return f"file://{folder}"


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def set_pipeline(topic: str, fmt: AvroFormat, tmp_path: Path, *more: SinkSpec) -> tuple[str, Path]:
    """The module's PIPELINE, for the runner to find: ``fmt`` from ``topic`` to a files table (and
    ``more`` sinks)."""
    global PIPELINE
    name, files = f"avro_{uuid.uuid4().hex[:8]}", tmp_path / "files"
    sink = SinkSpec("orders", "files", {"root": str(files), "table": "orders"})
    PIPELINE = Pipeline(name, KafkaSource((topic,)), fmt, (sink, *more))
    return name, files


def registry_settings(tmp_path: Path) -> tuple[Settings, Settings]:
    """Settings with a registry that does not answer, and with the folder of schemas; one ledger."""
    base = {
        **os.environ,
        "ONCEFLOW_LEDGER_URL": f"sqlite:///{tmp_path}/ledger.db",
        "ONCEFLOW_HOME": str(tmp_path),
    }
    folder = schema_folder(tmp_path / "schemas")
    down = Settings.from_env(
        {
            **base,
            "ONCEFLOW_SCHEMA_REGISTRY_URL": f"http://u:pw@127.0.0.1:{closed_port()}",
            "ONCEFLOW_SCHEMA_REGISTRY_ALLOW_INSECURE_AUTH": "true",
        }
    )
    up = Settings.from_env({**base, "ONCEFLOW_SCHEMA_REGISTRY_URL": folder})
    with Ledger.connect(up.ledger_url, check=False) as ledger:
        ledger.upgrade()
    return down, up


@pytest.mark.parametrize("executor", ["local", pytest.param("connect", marks=pytest.mark.slow)])
def test_avro_orders_of_two_versions_become_rows_and_bad_records_dead_letters(
    settings: Settings,
    make_topic: Any,
    pg_database: str,
    tmp_path: Path,
    executor: Executor,
    request: pytest.FixtureRequest,
    capfd: pytest.CaptureFixture[str],
) -> None:
    topic = make_topic("avro")
    columns = {"id": "bigint", "amount": "numeric(9,2)", "at": "timestamptz", "coupon": "text"}
    pg = SinkSpec("orders_pg", "postgres_2pc", {"dsn": pg_database, "table": "orders", "columns": columns})
    fmt = AvroFormat(subject="orders-value", key_field="order_key")
    name, files = set_pipeline(topic, fmt, tmp_path, pg)
    down, up = registry_settings(tmp_path)

    good = [framed(1, order(i)) for i in range(0, 5)]
    good += [framed(2, {**order(i), "coupon": f"C{i}"}) for i in range(5, 10)]
    bad = {
        "bad_magic_byte": b'{"id": 1}',
        "unknown_schema_id": b"\x00\x00\x00\x00\x63" + framed(2, {**order(98), "coupon": None})[5:],
        "malformed_avro": framed(2, {**order(97), "coupon": None})[:-4],
        "incompatible_schema": framed(3, {"id": "A-1"}),
        "null_field": framed(4, {"id": 99, "amount": None, "at": START}),
    }
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    for i, value in enumerate(good):
        producer.produce(topic, key=f"k{i}".encode(), value=value)
    for code, value in bad.items():
        producer.produce(topic, key=code.encode(), value=value)
    producer.flush(30)

    remote = None
    if executor == "connect":  # the warm runtime, started if it is not running (and left running)
        remote = request.getfixturevalue("runtime").start()

    def epoch(on: Settings) -> Any:
        return run_epoch(f"{__name__}:PIPELINE", on, executor=executor, spark_remote_url=remote)

    # The subject's schema cannot be read while the registry is down: the plan, which compares it with
    # the last epoch's, fails in one line, and no epoch is planned.
    with pytest.raises(RegistryUnavailable) as failed:
        epoch(down)
    assert "schema registry http://u:***@127.0.0.1:" in str(failed.value)
    assert "is unreachable for subject 'orders-value'" in str(failed.value)
    assert ":pw@" not in str(failed.value)
    with Ledger.connect(up.ledger_url) as ledger:
        assert ledger.epochs(name) == [] and ledger.dead_letters(name) == []

    outcome = epoch(up)
    assert outcome.epoch.status == EpochStatus.COMMITTED and outcome.epoch.number == 1
    if executor == "connect":  # version 2 is decoded in the JVM; version 1 (a promoted id) in Python
        path = "jvm read path (Spark's Kafka source and from_avro (1 writer schemas))"
        assert path in capfd.readouterr().err
    table = read_committed_table(files, "orders").sort_by("id")
    assert table.column("id").to_pylist() == list(range(10))
    assert table.column("amount").to_pylist() == [decimal.Decimal(i) / 4 for i in range(10)]
    assert str(table.schema.field("amount").type) == "decimal128(38, 2)"
    assert table.column("at").to_pylist()[3] == START + dt.timedelta(seconds=3)
    assert table.column("coupon").to_pylist() == [None] * 5 + [f"C{i}" for i in range(5, 10)]
    assert table.column("order_key").to_pylist() == [f"k{i}" for i in range(10)]
    with psycopg.connect(pg_database) as conn:
        stored = conn.execute("SELECT id, amount, at, coupon FROM orders ORDER BY id").fetchall()
    assert stored == [
        (i, decimal.Decimal(i) / 4, START + dt.timedelta(seconds=i), None if i < 5 else f"C{i}")
        for i in range(10)
    ]
    with Ledger.connect(up.ledger_url) as ledger:
        letters = {d.letter.key: d.letter for d in ledger.dead_letters(name)}
    assert sorted(letters) == sorted(code.encode() for code in bad)
    for code, letter in letters.items():
        assert letter.reason.startswith(f"{code.decode()}: "), letter.reason
        assert letter.offset == len(good) + list(bad).index(code.decode())


def test_a_registry_that_stops_answering_mid_decode_aborts_the_epoch_and_no_record_is_dead_lettered(
    settings: Settings, make_topic: Any, tmp_path: Path
) -> None:
    """The reader schema from a file: only writer ids need the registry, looked up while decoding."""
    topic = make_topic("avro")
    reader = tmp_path / "order.avsc"
    reader.write_text(json.dumps(V2))
    name, files = set_pipeline(topic, AvroFormat(schema_file=str(reader)), tmp_path)
    down, up = registry_settings(tmp_path)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    for i in range(6):
        producer.produce(topic, value=framed(1 + i % 2, {**order(i), "coupon": None}))
    producer.flush(30)
    with pytest.raises(ProcessFailed, match="is unreachable for schema id 1"):
        run_epoch(f"{__name__}:PIPELINE", down, executor="local")
    with Ledger.connect(up.ledger_url) as ledger:
        assert ledger.epoch(name, 1).status == EpochStatus.ABORTED
        assert ledger.dead_letters(name) == []
    assert run_epoch(f"{__name__}:PIPELINE", up, executor="local").epoch.status == EpochStatus.COMMITTED
    assert sorted(read_committed_table(files, "orders").column("id").to_pylist()) == list(range(6))


def test_the_kafka_sink_publishes_avro_records_of_the_subjects_latest_schema(
    settings: Settings, make_topic: Any, tmp_path: Path
) -> None:
    from tests.integration.kafka_sink_helpers import read_topic

    topic, out = make_topic("avro"), make_topic("avro-out")
    sink = SinkSpec(
        "orders_out",
        "kafka",
        {"topic": out, "staging_root": str(tmp_path / "staging"), "value_format": "avro", "key_column": "id"},
    )
    set_pipeline(topic, AvroFormat(subject="orders-value"), tmp_path, sink)
    _, up = registry_settings(tmp_path)
    (tmp_path / "schemas" / "registry.json").write_text(
        (tmp_path / "schemas" / "registry.json").read_text().replace('"orders-out-value"', f'"{out}-value"')
    )
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    for i in range(4):
        producer.produce(topic, value=framed(1 + i % 2, {**order(i), "coupon": None}))
    producer.flush(30)
    assert run_epoch(f"{__name__}:PIPELINE", up, executor="local").epoch.status == EpochStatus.COMMITTED
    records = read_topic(settings.kafka_bootstrap, out, 1, "read_committed")
    assert [key for _, key, _ in records] == [b"0", b"1", b"2", b"3"]
    assert all(value[:5] == b"\x00\x00\x00\x00\x05" for _, _, value in records)
    reader = tmp_path / "out.avsc"  # without _partition, a name rows reserve: Avro resolution drops it
    reader.write_text(json.dumps({**OUT, "fields": OUT["fields"][:2]}))
    decoder = RowDecoder(
        AvroFormat(schema_file=str(reader)), 10_000, FolderSchemaRegistry(tmp_path / "schemas")
    )
    rows = [decoder.decode_row(KafkaRecord(out, 0, i, None, k, v)) for i, (_, k, v) in enumerate(records)]
    assert [(r["id"], r["amount"]) for r in rows] == [(i, decimal.Decimal(i) / 4) for i in range(4)]  # type: ignore[index]


def test_avro_orders_through_spark_submit_with_a_transform(
    settings: Settings, make_topic: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Python reader inside Spark tasks: decimals, timestamps and dead letters as on the local path."""
    import importlib

    from tests.integration import avro_pipelines

    topic, name = make_topic("avro"), f"avro_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("AVRO_TEST_TOPIC", topic)
    monkeypatch.setenv("AVRO_TEST_PIPELINE", name)
    monkeypatch.setenv("AVRO_TEST_FILES", str(tmp_path / "files"))
    importlib.reload(avro_pipelines)
    _, up = registry_settings(tmp_path)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    for i in range(8):
        producer.produce(topic, key=f"k{i}".encode(), value=framed(1 + i % 2, {**order(i), "coupon": None}))
    producer.produce(topic, key=b"bad", value=framed(4, {"id": 99, "amount": None, "at": START}))
    producer.flush(30)
    outcome = run_epoch("tests.integration.avro_pipelines:AVRO_ORDERS", up, executor="submit")
    assert outcome.epoch.status == EpochStatus.COMMITTED and outcome.executor == "submit"
    table = read_committed_table(tmp_path / "files", "orders").sort_by("id")
    assert table.column("id").to_pylist() == list(range(4, 8))  # amount i/4 >= 1
    assert table.column("amount").to_pylist() == [decimal.Decimal(i) / 4 for i in range(4, 8)]
    assert table.column("at").to_pylist() == [START + dt.timedelta(seconds=i) for i in range(4, 8)]
    assert table.column("order_key").to_pylist() == [f"k{i}" for i in range(4, 8)]
    with Ledger.connect(up.ledger_url) as ledger:
        reasons = [d.letter.reason for d in ledger.dead_letters(name)]
    assert reasons == [
        "null_field: field 'amount' is null (writer schema id 4), the reader schema requires it"
    ]

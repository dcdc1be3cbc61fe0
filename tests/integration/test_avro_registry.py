"""Avro pipelines against the stack's real schema registry (Apicurio Registry, its Confluent-compatible
API): schemas registered over HTTP, a producer that moves from schema v1 to a compatible v2 while the
pipeline runs epochs, and a sink that writes Avro of a subject the registry holds.

The pipeline reads with its subject's latest schema, which each slice pins: epochs before v2 was
registered have v1's columns, later ones v2's, and v1 records read after the switch take v2's default.
The registry enforces BACKWARD compatibility on the subject, so v2 is a schema it accepted. Every record
must land once in the files table and once in the Kafka output; a record naming an id the registry does
not know is a dead letter with its reason, at its offset.
"""

from __future__ import annotations

import decimal
import json
import os
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from fastavro import parse_schema

from onceflow.config import Settings
from onceflow.decoding.records import KafkaRecord, RowDecoder
from onceflow.decoding.schema_registry import MAGIC_BYTE, WIRE_HEADER, HttpSchemaRegistry, wire_value
from onceflow.engine.runner import run_epoch
from onceflow.ledger import EpochStatus, Ledger
from onceflow.pipeline import AvroFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.sinks.files import read_committed_table

pytestmark = pytest.mark.integration

AMOUNT = {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}
V1 = {
    "type": "record",
    "name": "Order",
    "namespace": "onceflow.test",
    "fields": [{"name": "id", "type": "int"}, {"name": "amount", "type": AMOUNT}],
}
# What the producer moves to: id widened to long, a nullable coupon with a default (BACKWARD-compatible).
V2 = {
    "type": "record",
    "name": "Order",
    "namespace": "onceflow.test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": AMOUNT},
        {"name": "coupon", "type": ["null", "string"], "default": None},
    ],
}
# The Kafka sink's records; rows of epochs read with v1 have no coupon, so it takes the default.
OUT = {
    "type": "record",
    "name": "OrderOut",
    "namespace": "onceflow.test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": AMOUNT},
        {"name": "coupon", "type": ["null", "string"], "default": None},
        {"name": "_partition", "type": "int"},
        {"name": "_offset", "type": "long"},
    ],
}
UNKNOWN_ID = 2**31 - 1  # no registry in a test run hands out this many ids
PARTITIONS = 2

PIPELINE: Pipeline  # set by the test, found by the runner as f"{__name__}:PIPELINE"


def set_compatibility(registry: HttpSchemaRegistry, subject: str, level: str) -> None:
    """The subject's compatibility rule, set over the API's plain HTTP (the client has no call for it)."""
    parts = urllib.parse.urlsplit(registry.url)
    path = f"{parts.path.rstrip('/')}/config/{urllib.parse.quote(subject, safe='')}"
    request = urllib.request.Request(
        urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", "")),
        data=json.dumps({"compatibility": level}).encode(),
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
        method="PUT",
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert json.loads(answer.read())["compatibility"] == level


def framed(schema_id: int, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    """The registry wire format: magic byte 0, the 4-byte schema id, the Avro body."""
    return wire_value(schema_id, parse_schema(schema), record)


def amount(i: int) -> decimal.Decimal:
    return decimal.Decimal(i * 25) / 100


def coupon(i: int) -> str | None:
    return f"C{i}" if i % 3 else None  # v2 records with and without a coupon


def test_a_producer_moving_to_a_compatible_schema_mid_run_lands_every_record_once(
    settings: Settings, schema_registry: HttpSchemaRegistry, make_topic: Any, tmp_path: Path
) -> None:
    global PIPELINE
    topic, out = make_topic("avro-reg", partitions=PARTITIONS), make_topic("avro-reg-out")
    subject = f"{topic}-value"
    set_compatibility(schema_registry, subject, "BACKWARD")
    v1_id = schema_registry.register(subject, json.dumps(V1))
    out_id = schema_registry.register(f"{out}-value", json.dumps(OUT))

    name, files = f"avro_reg_{uuid.uuid4().hex[:8]}", tmp_path / "files"
    kafka = {
        "topic": out,
        "staging_root": str(tmp_path / "staging"),
        "value_format": "avro",
        "key_column": "id",
    }
    PIPELINE = Pipeline(
        name,
        KafkaSource((topic,)),
        AvroFormat(subject=subject, key_field="order_key"),
        (
            SinkSpec("orders", "files", {"root": str(files), "table": "orders"}),
            SinkSpec("orders_out", "kafka", {**kafka, "key_column": "id"}),
        ),
    )
    run = Settings.from_env(
        {
            **os.environ,
            "ONCEFLOW_LEDGER_URL": f"sqlite:///{tmp_path}/ledger.db",
            "ONCEFLOW_HOME": str(tmp_path),
            "ONCEFLOW_SCHEMA_REGISTRY_URL": schema_registry.url,
        }
    )
    with Ledger.connect(run.ledger_url, check=False) as ledger:
        ledger.upgrade()
    spec = f"{__name__}:PIPELINE"
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})

    def produce(key: bytes, value: bytes, i: int) -> None:
        producer.produce(topic, key=key, value=value, partition=i % PARTITIONS)

    # v1 orders 0..11; the first epoch reads 4 per partition, with v1 as the reader schema.
    for i in range(12):
        produce(f"k{i}".encode(), framed(v1_id, V1, {"id": i, "amount": amount(i)}), i)
    producer.flush(30)
    first = run_epoch(spec, run, executor="local", max_records_per_partition=4)
    assert first.epoch.status == EpochStatus.COMMITTED
    assert "coupon" not in read_committed_table(files, "orders").column_names

    # The producer moves to v2 (the registry checks it against v1), with v1 orders still in the backlog.
    v2_id = schema_registry.register(subject, json.dumps(V2))
    assert v2_id != v1_id and schema_registry.latest(subject).id == v2_id
    for i in range(12, 24):
        produce(f"k{i}".encode(), framed(v2_id, V2, {"id": i, "amount": amount(i), "coupon": coupon(i)}), i)
    unknown = framed(v2_id, V2, {"id": 99, "amount": amount(99), "coupon": None})
    produce(b"unknown", WIRE_HEADER.pack(MAGIC_BYTE, UNKNOWN_ID) + unknown[WIRE_HEADER.size :], 0)
    producer.flush(30)
    # The rest, 5 offsets per partition an epoch: partition 0 holds 9 (with the unknown id), 1 holds 8.
    epochs = [run_epoch(spec, run, executor="local", max_records_per_partition=5) for _ in range(3)]
    assert [e.epoch.status for e in epochs] == [EpochStatus.COMMITTED] * 3
    assert [sum(r.span for r in e.epoch.ranges) for e in epochs] == [10, 7, 0]  # the last: caught up

    table = read_committed_table(files, "orders").sort_by("id")
    assert table.column("id").to_pylist() == list(range(24))
    assert table.column("amount").to_pylist() == [amount(i) for i in range(24)]
    assert table.column("coupon").to_pylist() == [None] * 12 + [coupon(i) for i in range(12, 24)]
    assert table.column("order_key").to_pylist() == [f"k{i}" for i in range(24)]

    from tests.integration.kafka_sink_helpers import read_topic

    records = read_topic(settings.kafka_bootstrap, out, 1, "read_committed")
    assert {value[: WIRE_HEADER.size] for _, _, value in records} == {WIRE_HEADER.pack(MAGIC_BYTE, out_id)}
    reader = {**OUT, "fields": OUT["fields"][:3]}  # without _partition and _offset, names rows reserve
    decoder = RowDecoder(AvroFormat(subject=f"{out}-value").pin(json.dumps(reader)), 10_000, schema_registry)
    rows = [decoder.decode_row(KafkaRecord(out, 0, n, None, k, v)) for n, (_, k, v) in enumerate(records)]
    decoded = sorted((r["id"], r["amount"], r["coupon"]) for r in rows)  # type: ignore[index]
    assert decoded == [(i, amount(i), None if i < 12 else coupon(i)) for i in range(24)]

    with Ledger.connect(run.ledger_url) as ledger:
        letters = [d.letter for d in ledger.dead_letters(name)]
    assert [(d.key, d.partition, d.offset) for d in letters] == [(b"unknown", 0, 12)]
    assert letters[0].reason == f"unknown_schema_id: the schema registry has no schema id {UNKNOWN_ID}"

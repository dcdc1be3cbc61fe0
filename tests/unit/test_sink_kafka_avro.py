"""The Kafka sink's ``value_format: avro``: staged records are the registry wire format of the subject's
latest schema, which the Avro decoder reads back as the rows that were written."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from onceflow.committables import TaskContext
from onceflow.decoding.records import DeadLetter, KafkaRecord, RowDecoder
from onceflow.decoding.schema_registry import FolderSchemaRegistry
from onceflow.errors import ConfigError
from onceflow.offsets import OffsetRange
from onceflow.pipeline import AvroFormat
from onceflow.sinks.errors import RowError
from onceflow.sinks.kafka import KafkaSinkConfig, KafkaWriter, read_records

AMOUNT = {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}
OLD = {"type": "record", "name": "Out", "fields": [{"name": "id", "type": "long"}]}
OUT = {
    "type": "record",
    "name": "Out",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": AMOUNT},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}
AT = dt.datetime(2026, 11, 25, 8, 0, 0, 123456, tzinfo=dt.UTC)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    schemas = tmp_path / "schemas"
    schemas.mkdir()
    (schemas / "old.avsc").write_text(json.dumps(OLD))
    (schemas / "out.avsc").write_text(json.dumps(OUT))
    entries = [
        {"id": 3, "subject": "orders-out-value", "version": 1, "file": "old.avsc"},
        {"id": 4, "subject": "orders-out-value", "version": 2, "file": "out.avsc"},
    ]
    (schemas / "registry.json").write_text(json.dumps({"schemas": entries}))
    return schemas


def config(tmp_path: Path, folder: Path, **more: Any) -> dict[str, Any]:
    return {
        "topic": "orders-out",
        "staging_root": str(tmp_path / "staging"),
        "bootstrap": "127.0.0.1:9",
        "value_format": "avro",
        "schema_registry_url": f"file://{folder}",
        "name": "out",
        **more,
    }


def staged(tmp_path: Path) -> list[tuple[bytes | None, bytes]]:
    return list(read_records(next((tmp_path / "staging").rglob("records.bin"))))


def test_rows_and_batches_are_staged_as_the_subjects_latest_schema(tmp_path: Path, folder: Path) -> None:
    rows = [
        {"id": i, "amount": Decimal(i) / 4, "at": AT, "note": None if i % 2 else f"n{i}"} for i in range(4)
    ]
    writer = KafkaWriter(config(tmp_path, folder, key_column="id"))
    writer.begin(TaskContext("p", 1, 0, "s0-t0", "a1", "out", (OffsetRange("in", 0, 0, 4),)))
    writer.write(rows[:2])
    writer.write_batch(pa.RecordBatch.from_pylist(rows[2:]))
    assert writer.pre_commit().record_count == 4
    records = staged(tmp_path)
    assert [key for key, _ in records] == [b"0", b"1", b"2", b"3"]
    assert {value[:5] for _, value in records} == {b"\x00\x00\x00\x00\x04"}  # the latest: id 4
    reader = tmp_path / "out.avsc"
    reader.write_text(json.dumps(OUT))
    decoder = RowDecoder(AvroFormat(schema_file=str(reader)), 10_000, FolderSchemaRegistry(folder))
    decoded = [
        decoder.decode_row(KafkaRecord("orders-out", 0, i, None, k, v)) for i, (k, v) in enumerate(records)
    ]
    assert not [d for d in decoded if isinstance(d, DeadLetter)]
    assert [{k: d[k] for k in ("id", "amount", "at", "note")} for d in decoded] == rows  # type: ignore[index]


def test_a_row_the_schema_cannot_hold_fails_the_task_in_one_line(tmp_path: Path, folder: Path) -> None:
    writer = KafkaWriter(config(tmp_path, folder))
    writer.begin(TaskContext("p", 1, 0, "s0-t0", "a1", "out", (OffsetRange("in", 0, 0, 1),)))
    with pytest.raises(RowError) as raised:
        writer.write([{"id": "seven", "amount": Decimal("1.00"), "at": AT}])
    message = str(raised.value)
    assert "does not fit schema id 4 of subject 'orders-out-value'" in message and "\n" not in message


def test_avro_values_need_a_registry_and_a_registered_subject(tmp_path: Path, folder: Path) -> None:
    no_registry = {k: v for k, v in config(tmp_path, folder).items() if k != "schema_registry_url"}
    with pytest.raises(ConfigError, match="value_format 'avro' needs a schema registry"):
        KafkaWriter(no_registry)
    writer = KafkaWriter(config(tmp_path, folder, subject="nothing-here"))
    writer.begin(TaskContext("p", 1, 0, "s0-t0", "a1", "out", (OffsetRange("in", 0, 0, 1),)))
    with pytest.raises(ConfigError, match="has no subject 'nothing-here'; register the value schema first"):
        writer.write([{"id": 1}])
    with pytest.raises(ConfigError, match="subject: only used with value_format 'avro'"):
        KafkaSinkConfig.from_mapping({**config(tmp_path, folder), "value_format": "json", "subject": "x"})
    assert KafkaSinkConfig.from_mapping(config(tmp_path, folder)).value_subject == "orders-out-value"


def test_registry_credentials_over_plain_http_need_the_deployments_consent(tmp_path: Path) -> None:
    from onceflow.config import Settings
    from onceflow.sinks.registry import sink_kind

    url = "http://writer:s3cret@127.0.0.1:9/api"
    writer = KafkaWriter(config(tmp_path, tmp_path, subject="s", schema_registry_url=url))
    writer.begin(TaskContext("p", 1, 0, "s0-t0", "a1", "out", (OffsetRange("in", 0, 0, 1),)))
    with pytest.raises(ConfigError) as raised:
        writer.write([{"id": 1}])
    assert "ONCEFLOW_SCHEMA_REGISTRY_ALLOW_INSECURE_AUTH=true" in str(raised.value)
    assert "s3cret" not in str(raised.value)
    env = {"ONCEFLOW_SCHEMA_REGISTRY_URL": url, "ONCEFLOW_SCHEMA_REGISTRY_ALLOW_INSECURE_AUTH": "true"}
    defaults = sink_kind("kafka").defaults(Settings.from_env(env))
    assert defaults["schema_registry_allow_insecure_auth"] is True
    assert KafkaSinkConfig.from_mapping(
        {**config(tmp_path, tmp_path), **defaults}
    ).schema_registry_allow_insecure_auth
    assert "schema_registry_allow_insecure_auth" not in sink_kind("kafka").defaults(Settings.from_env({}))

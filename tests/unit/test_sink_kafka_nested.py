"""The Kafka sink with nested values: ``value_format: json`` writes structs and maps as objects, arrays
as arrays, timestamps, dates, decimals and bytes as a consumer reads them back, the same bytes from rows
and from Spark's batches; ``value_format: avro`` writes nested records, arrays and maps."""

from __future__ import annotations

import base64
import datetime as dt
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from onceflow.decoding.records import DeadLetter, KafkaRecord, RowDecoder
from onceflow.decoding.schema_registry import FolderSchemaRegistry
from onceflow.offsets import OffsetRange
from onceflow.pipeline import AvroFormat
from onceflow.sinks._kafka_batches import json_value
from onceflow.sinks.base import TaskContext
from onceflow.sinks.errors import RowError
from onceflow.sinks.kafka import KafkaWriter, read_records
from tests.unit.test_sink_files_nested import COLUMNS, order_rows, spark_batch

UTC = dt.UTC


def task() -> TaskContext:
    return TaskContext("p", 1, 0, "s0-t0", "a1", "out", (OffsetRange("in", 0, 0, 3),))


def stage(root: Path, feed: str, batches: list[pa.RecordBatch], **config: Any) -> bytes:
    writer = KafkaWriter(
        {"topic": "t", "staging_root": str(root), "bootstrap": "h:1", "name": "out", **config}
    )
    writer.begin(task())
    for batch in batches:
        if feed == "rows":
            writer.write(batch.to_pylist(maps_as_pydicts="strict"))
        else:
            writer.write_batch(batch)
    writer.pre_commit()
    return next(root.glob("_staging/**/records.bin")).read_bytes()


def read_back(value: Any, kind: str) -> Any:
    """A JSON value parsed back into the row model's type ``kind`` ("at", "day", "raw" or other)."""
    if value is None:
        return None
    if kind == "at":
        return dt.datetime.fromisoformat(value)
    if kind == "day":
        return dt.date.fromisoformat(value)
    if kind == "raw":
        return base64.b64decode(value, validate=True)
    return value


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Decimal("12.50"), "12.50"),
        (Decimal("1E+2"), "100"),
        (Decimal("-0.000001"), "-0.000001"),
        (dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC), '"2026-01-02T03:04:05.000006+00:00"'),
        (
            dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone(dt.timedelta(hours=2))),
            '"2026-01-02T03:04:05+02:00"',
        ),
        (dt.date(2026, 2, 28), '"2026-02-28"'),
        (b"\x00\xff\xfe", '"AP/+"'),
        ({"b": [1, {"y": None, "x": "é"}], "a": {}}, '{"a": {}, "b": [1, {"x": "é", "y": null}]}'),
        ({"b": Decimal("0.10"), "a": [Decimal("3"), None]}, '{"a": [3, null], "b": 0.10}'),
    ],
)
def test_json_values_are_what_a_consumer_reads_back(value: Any, text: str) -> None:
    assert json_value(value) == text
    json.loads(text)  # valid JSON


def test_decimals_keep_their_digits_where_a_float_would_not() -> None:
    digits = "12345678901234567890.123456789012345678"
    parsed = json.loads(json_value({"d": [Decimal(digits)]}), parse_float=Decimal)
    assert str(parsed["d"][0]) == digits


def test_a_decimal_without_a_number_is_refused() -> None:
    with pytest.raises(RowError, match="has no JSON number"):
        json_value({"a": {"b": Decimal("NaN")}})


@pytest.mark.parametrize("key_column", [None, "id"])
def test_nested_json_records_from_batches_are_the_rows_records(
    tmp_path: Path, key_column: str | None
) -> None:
    batch = spark_batch(order_rows(17))
    parts = [batch.slice(0, 5), batch.slice(5)]
    config: dict[str, Any] = {"value_format": "json", "key_column": key_column}
    from_rows = stage(tmp_path / "r", "rows", parts, **config)
    from_batches = stage(tmp_path / "b", "batches", parts, **config)
    assert from_rows == from_batches
    records = list(read_records(next((tmp_path / "b").glob("_staging/**/records.bin"))))
    rows = batch.to_pylist(maps_as_pydicts="strict")
    assert len(records) == len(rows)
    for (key, value), row in zip(records, rows, strict=True):
        assert key == (None if key_column is None else str(row["id"]).encode())
        got = json.loads(value, parse_float=Decimal)
        assert sorted(got) == sorted(name for name, _, _ in COLUMNS)
        assert got["id"] == row["id"] and got["tags"] == row["tags"] and got["counts"] == row["counts"]
        if row["order"] is None:
            assert got["order"] is None
            continue
        order = {k: read_back(v, k) for k, v in got["order"].items()}
        assert order == row["order"]


def test_a_map_with_a_key_twice_is_refused(tmp_path: Path) -> None:
    batch = pa.record_batch({"m": pa.array([[("a", 1), ("a", 2)]], pa.map_(pa.string(), pa.int64()))})
    writer = KafkaWriter(
        {"topic": "t", "staging_root": str(tmp_path), "bootstrap": "h:1", "value_format": "json"}
    )
    writer.begin(task())
    with pytest.raises(RowError, match="a map holds a key twice"):
        writer.write_batch(batch)
    writer.abort()


ITEM = {
    "type": "record",
    "name": "Item",
    "fields": [{"name": "sku", "type": "string"}, {"name": "qty", "type": "long"}],
}
ORDER = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "raw", "type": ["null", "bytes"]},
        {"name": "items", "type": {"type": "array", "items": ITEM}},
        {"name": "attrs", "type": {"type": "map", "values": ["null", "long"]}},
    ],
}
OUT = {
    "type": "record",
    "name": "Out",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "order", "type": ["null", ORDER]},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "counts", "type": ["null", {"type": "map", "values": "long"}]},
    ],
}


def test_avro_values_hold_nested_records_arrays_and_maps(tmp_path: Path) -> None:
    folder = tmp_path / "schemas"
    folder.mkdir()
    (folder / "out.avsc").write_text(json.dumps(OUT))
    entry = {"id": 7, "subject": "out-value", "version": 1, "file": "out.avsc"}
    (folder / "registry.json").write_text(json.dumps({"schemas": [entry]}))
    batch = spark_batch(order_rows(11))
    config = {"value_format": "avro", "schema_registry_url": f"file://{folder}", "subject": "out-value"}
    from_rows = stage(tmp_path / "r", "rows", [batch], **config)
    from_batches = stage(tmp_path / "b", "batches", [batch], **config)
    assert from_rows == from_batches
    records = list(read_records(next((tmp_path / "b").glob("_staging/**/records.bin"))))
    decoder = RowDecoder(
        AvroFormat(schema_file=str(folder / "out.avsc")), 1 << 20, FolderSchemaRegistry(folder)
    )
    decoded = [decoder.decode_row(KafkaRecord("t", 0, i, None, k, v)) for i, (k, v) in enumerate(records)]
    assert not [d for d in decoded if isinstance(d, DeadLetter)]
    names = [name for name, _, _ in COLUMNS]
    got = [{n: d[n] for n in names} for d in decoded]  # type: ignore[index]
    assert got == batch.to_pylist(maps_as_pydicts="strict")

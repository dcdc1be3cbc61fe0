"""Nested Avro on the Python path (fastavro): records, arrays, maps and nullable unions at any depth give
the very values the JSON path gives for the same type texts, a value the row cannot hold is a dead
letter naming its path, and schemas rows cannot hold are refused at spec build naming the field's path."""

from __future__ import annotations

import base64
import copy
import datetime as dt
import io
import json
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer
from pyspark.sql import types as T
from pyspark.sql.types import _make_type_verifier

from onceflow.decoding.records import (
    DEAD_LETTER_CODES,
    DeadLetter,
    KafkaRecord,
    RowDecoder,
    row_columns,
    spark_schema,
)
from onceflow.errors import ConfigError
from onceflow.pipeline import AvroFormat, JsonFormat
from onceflow.schemas.avro import avro_columns, avro_fields
from onceflow.schemas.types import parse_type

PRICE = {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}
ITEM = {
    "type": "record",
    "name": "Item",
    "fields": [
        {"name": "sku", "type": "string"},
        {"name": "qty", "type": "int"},
        {"name": "price", "type": ["null", PRICE], "default": None},
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
    ],
}
ADDRESS = {
    "type": "record",
    "name": "Address",
    "fields": [
        {"name": "city", "type": "string"},
        {"name": "zip", "type": ["null", "string"], "default": None},
    ],
}
ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "items", "type": {"type": "array", "items": ITEM}},
        {"name": "ship", "type": ["null", ADDRESS], "default": None},
        {"name": "attrs", "type": {"type": "map", "values": ["null", "long"]}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        {"name": "raw", "type": {"type": "fixed", "name": "Raw", "size": 2}},
        {"name": "tags", "type": {"type": "array", "items": ["null", "string"]}},
        {"name": "grid", "type": {"type": "map", "values": {"type": "array", "items": "double"}}},
    ],
}
REF = uuid.UUID("12345678-1234-5678-1234-567812345678")
AT = dt.datetime(2026, 11, 25, 12, 30, 1, 123_456, tzinfo=dt.UTC)


def avsc(tmp_path: Path, schema: dict[str, Any], name: str = "reader.avsc") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(schema))
    return str(path)


def body(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, parse_schema(copy.deepcopy(schema)), record)
    return out.getvalue()


def decode(fmt: AvroFormat | JsonFormat, value: bytes) -> Any:
    return RowDecoder(fmt, 10**7, None).decode_row(KafkaRecord("t", 0, 9, None, None, value))


def reason(decoded: Any) -> str:
    assert isinstance(decoded, DeadLetter), decoded
    assert decoded.code in DEAD_LETTER_CODES
    return decoded.reason


def order(**overrides: Any) -> dict[str, Any]:
    written: dict[str, Any] = {
        "id": 7,
        "items": [
            {"sku": "a", "qty": 2, "price": Decimal("12.34"), "ref": REF},
            {"sku": "b", "qty": 1, "price": None, "ref": REF},
        ],
        "ship": {"city": "Lyon", "zip": None},
        "attrs": {"colour": 3, "size": None},
        "at": AT,
        "day": dt.date(2026, 11, 25),
        "kind": "B",
        "raw": b"\x00\xff",
        "tags": ["x", None],
        "grid": {"r": [0.5, -0.0]},
    }
    written.update(overrides)
    return written


def test_nested_avro_types_become_the_nested_row_types(tmp_path: Path) -> None:
    fmt = AvroFormat(schema_file=avsc(tmp_path, ORDER), wire="plain")
    assert row_columns(fmt)[:10] == [
        ("id", "int", False),
        ("items", "array<struct<sku:string,qty:int,price:decimal(10,2)?,ref:string>>", False),
        ("ship", "struct<city:string,zip:string?>", True),
        ("attrs", "map<string,int?>", False),
        ("at", "timestamp", False),
        ("day", "date", False),
        ("kind", "string", False),
        ("raw", "bytes", False),
        ("tags", "array<string?>", False),
        ("grid", "map<string,array<float>>", False),
    ]
    # The flat columns of a flat schema keep the texts they always had.
    flat = {"type": "record", "name": "F", "fields": [{"name": "n", "type": ["null", "long"]}]}
    assert avro_columns("w", flat) == [("n", "int", True)]


def test_a_nested_record_decodes_to_the_values_the_json_path_gives_for_the_same_types(tmp_path: Path) -> None:
    fmt = AvroFormat(schema_file=avsc(tmp_path, ORDER), wire="plain")
    row = decode(fmt, body(ORDER, order()))
    assert isinstance(row, dict)
    assert row["items"] == [
        {"sku": "a", "qty": 2, "price": Decimal("12.34"), "ref": str(REF)},
        {"sku": "b", "qty": 1, "price": None, "ref": str(REF)},
    ]
    assert row["ship"] == {"city": "Lyon", "zip": None} and row["attrs"] == {"colour": 3, "size": None}
    assert row["at"] == AT and row["raw"] == b"\x00\xff" and row["kind"] == "B"
    # The JSON path, for the same type texts and the same values, gives the same row.
    same = JsonFormat(
        {name: text + ("?" if nullable else "") for name, text, nullable in row_columns(fmt)[:10]}
    )
    document = {
        "id": 7,
        "items": [
            {"sku": "a", "qty": 2, "price": "12.34", "ref": str(REF)},
            {"sku": "b", "qty": 1, "ref": str(REF)},
        ],
        "ship": {"city": "Lyon", "zip": None},
        "attrs": {"colour": 3, "size": None},
        "at": "2026-11-25T13:30:01.123456+01:00",
        "day": "2026-11-25",
        "kind": "B",
        "raw": base64.b64encode(b"\x00\xff").decode(),
        "tags": ["x", None],
        "grid": {"r": [0.5, -0.0]},
    }
    from_json = decode(same, json.dumps(document).encode())
    assert isinstance(from_json, dict)
    columns = [name for name, _, _ in row_columns(fmt)[:10]]
    assert [(c, row[c]) for c in columns] == [(c, from_json[c]) for c in columns]
    assert [type(row[c]) for c in columns] == [type(from_json[c]) for c in columns]
    assert [list(v) for v in row["items"]] == [list(v) for v in from_json["items"]]  # same field order
    # And Spark's own check takes the row for the format's schema.
    verify = _make_type_verifier(spark_schema(fmt), nullable=False)
    verify(row)
    verify({**row, "ship": None})


def test_spark_schema_of_a_nested_avro_format(tmp_path: Path) -> None:
    fmt = AvroFormat(schema_file=avsc(tmp_path, ORDER), wire="plain")
    fields = {f.name: f for f in spark_schema(fmt).fields}
    assert fields["ship"] == T.StructField(
        "ship",
        T.StructType(
            [T.StructField("city", T.StringType(), False), T.StructField("zip", T.StringType(), True)]
        ),
        True,
    )
    assert fields["attrs"].dataType == T.MapType(T.StringType(), T.LongType(), valueContainsNull=True)
    assert fields["tags"].dataType == T.ArrayType(T.StringType(), containsNull=True)
    assert fields["items"].dataType.elementType["price"].dataType == T.DecimalType(10, 2)
    assert fields["grid"].dataType == T.MapType(T.StringType(), T.ArrayType(T.DoubleType(), False), False)


def _unscaled(unscaled: int) -> bytes:
    return unscaled.to_bytes((unscaled.bit_length() + 8) // 8, "big", signed=True)


def test_a_nested_decimal_wider_than_its_type_is_a_dead_letter_naming_its_path(tmp_path: Path) -> None:
    """fastavro rounds such a value; the row must not hold a value its column cannot."""
    fmt = AvroFormat(schema_file=avsc(tmp_path, ORDER), wire="plain")
    plain_bytes = json.loads(json.dumps(ORDER).replace('"logicalType": "decimal", ', ""))  # same encoding
    items = [
        {"sku": "a", "qty": 1, "price": _unscaled(1234), "ref": str(REF)},
        {"sku": "b", "qty": 1, "price": _unscaled(123456789012), "ref": str(REF)},
    ]
    written = order(items=items, at=1_700_000_000_000_000, day=20_000)
    assert reason(decode(fmt, body(plain_bytes, written))) == (
        "malformed_avro: field 'items[1].price': the unscaled value has more digits than decimal(10,2) holds"
    )
    items[1]["price"] = _unscaled(5)
    row = decode(fmt, body(plain_bytes, written))
    assert isinstance(row, dict) and [i["price"] for i in row["items"]] == [Decimal("12.34"), Decimal("0.05")]


def test_a_nested_decimal_in_a_map_of_records_is_checked_too(tmp_path: Path) -> None:
    schema = {
        "type": "record",
        "name": "R",
        "fields": [
            {
                "name": "m",
                "type": {
                    "type": "map",
                    "values": [
                        "null",
                        {"type": "record", "name": "V", "fields": [{"name": "p", "type": PRICE}]},
                    ],
                },
            }
        ],
    }
    fmt = AvroFormat(schema_file=avsc(tmp_path, schema), wire="plain")
    plain_bytes = json.loads(json.dumps(schema).replace('"logicalType": "decimal", ', ""))
    value = body(
        plain_bytes, {"m": {"ok": {"p": _unscaled(1)}, "none": None, "wide": {"p": _unscaled(10**12)}}}
    )
    assert reason(decode(fmt, value)) == (
        "malformed_avro: field 'm[\"wide\"].p': the unscaled value has more digits than decimal(10,2) holds"
    )


def test_a_writers_null_where_the_reader_requires_a_nested_value_is_named_by_its_path(tmp_path: Path) -> None:
    writer = json.loads(
        json.dumps(ORDER).replace(
            '{"name": "sku", "type": "string"}', '{"name": "sku", "type": ["null", "string"]}'
        )
    )
    fmt = AvroFormat(
        schema_file=avsc(tmp_path, ORDER),
        wire="plain",
        writer_schema_file=avsc(tmp_path, writer, "writer.avsc"),
    )
    items = [{"sku": "a", "qty": 1, "ref": REF}, {"sku": None, "qty": 1, "ref": REF}]
    assert reason(decode(fmt, body(writer, order(items=items)))) == (
        "null_field: field 'items[1].sku' is null (writer schema of the format), "
        "the reader schema requires it"
    )
    items[1]["sku"] = "b"
    row = decode(fmt, body(writer, order(items=items)))
    assert isinstance(row, dict) and [i["sku"] for i in row["items"]] == ["a", "b"]


def _retyped(old: str, new: str) -> dict[str, Any]:
    text = json.dumps(ORDER)
    assert old in text
    return json.loads(text.replace(old, new))


QTY_TEXT = [{"sku": "a", "qty": "2", "ref": REF}, {"sku": "b", "qty": "x", "ref": REF}]


@pytest.mark.parametrize(
    ("old", "new", "changes", "place"),
    [
        # An array element's field of another type: the first element read names it.
        (
            '{"name": "qty", "type": "int"}',
            '{"name": "qty", "type": "string"}',
            {"items": QTY_TEXT},
            "items[0].qty",
        ),
        # A map's values of a nullable type: resolved value by value, the first one not null names it.
        (
            '"values": ["null", "long"]',
            '"values": ["null", "string"]',
            {"attrs": {"n": None, "c": "3"}},
            'attrs["c"]',
        ),
        # A map whose values are arrays of another element type: the map itself.
        ('"items": "double"', '"items": "string"', {"grid": {"r": ["0.5"]}}, "grid"),
        # Inside a nullable record.
        (
            '{"name": "city", "type": "string"}',
            '{"name": "city", "type": "int"}',
            {"ship": {"city": 6}},
            "ship.city",
        ),
        # A reader field the writer's nested record lacks, without a default.
        ('{"name": "city", "type": "string"}, ', "", {"ship": {"zip": None}}, "ship.city"),
        # A top-level field.
        ('{"name": "id", "type": "long"}', '{"name": "id", "type": "string"}', {"id": "7"}, "id"),
    ],
)
def test_a_writer_whose_nested_type_does_not_resolve_is_named_by_its_path(
    tmp_path: Path, old: str, new: str, changes: dict[str, Any], place: str
) -> None:
    writer = _retyped(old, new)
    fmt = AvroFormat(
        schema_file=avsc(tmp_path, ORDER),
        wire="plain",
        writer_schema_file=avsc(tmp_path, writer, "writer.avsc"),
    )
    found = reason(decode(fmt, body(writer, order(**changes))))
    expected = f"writer schema of the format does not resolve to the reader schema at field {place!r} ("
    assert found.startswith(f"incompatible_schema: {expected}"), found


def test_a_nested_type_that_does_not_resolve_fails_only_records_that_hold_a_value_of_it(
    tmp_path: Path,
) -> None:
    """fastavro resolves value by value: no item, no item field to resolve."""
    writer = _retyped('{"name": "qty", "type": "int"}', '{"name": "qty", "type": "string"}')
    fmt = AvroFormat(
        schema_file=avsc(tmp_path, ORDER),
        wire="plain",
        writer_schema_file=avsc(tmp_path, writer, "writer.avsc"),
    )
    row = decode(fmt, body(writer, order(items=[])))
    assert isinstance(row, dict) and row["items"] == []
    assert "at field 'items[0].qty'" in reason(decode(fmt, body(writer, order(items=QTY_TEXT))))


def _record(*fields: dict[str, Any], name: str = "Top") -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": list(fields)}


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (
            _record({"name": "id", "type": "long"}, {"name": "next", "type": ["null", "Top"]}),
            "format.reader_schema field 'next': recursive reference to 'Top' (a row cannot hold itself)",
        ),
        (
            _record(
                {
                    "name": "items",
                    "type": {
                        "type": "array",
                        "items": _record({"name": "child", "type": ["null", "Node"]}, name="Node"),
                    },
                }
            ),
            "format.reader_schema field 'items[].child': recursive reference to 'Node'",
        ),
        (
            _record({"name": "a", "type": ADDRESS}, {"name": "b", "type": "Address"}),
            "format.reader_schema field 'b': type 'Address' has no row column (named types must be inline)",
        ),
        (
            _record({"name": "items", "type": {"type": "array", "items": ["int", "string"]}}),
            'format.reader_schema field \'items[]\': union ["int", "string"] is not supported',
        ),
        (
            _record(
                {
                    "name": "items",
                    "type": {
                        "type": "array",
                        "items": _record({"name": "price", "type": ["null", "int", "double"]}, name="I"),
                    },
                }
            ),
            "format.reader_schema field 'items[].price': union",
        ),
        (
            _record(
                {
                    "name": "m",
                    "type": {"type": "map", "values": {"type": "int", "logicalType": "time-millis"}},
                }
            ),
            "format.reader_schema field 'm{}': logical type 'time-millis' has no row column",
        ),
        (
            _record(
                {"name": "r", "type": _record({"name": "d", "type": {**PRICE, "precision": 40}}, name="In")}
            ),
            "format.reader_schema field 'r.d': decimal needs",
        ),
    ],
)
def test_schemas_rows_cannot_hold_are_refused_naming_the_path(
    tmp_path: Path, schema: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        AvroFormat(schema_file=avsc(tmp_path, schema), wire="plain")
    assert str(raised.value).startswith(message)
    assert "\n" not in str(raised.value)


def test_a_schema_nesting_past_the_limit_is_refused_not_a_recursion_error() -> None:
    inner: Any = "long"
    for _ in range(200):
        inner = {"type": "array", "items": inner}
    with pytest.raises(ConfigError, match="types nest deeper than 64 levels"):
        avro_fields("w", _record({"name": "x", "type": inner}))


def test_the_avro_types_parse_back_from_their_texts(tmp_path: Path) -> None:
    for name, t in avro_fields("w", ORDER):
        text = next(c for n, c, _ in avro_columns("w", ORDER) if n == name)
        assert parse_type(text + ("?" if t.nullable else "")) == t

"""Avro record values: every record becomes its row or one dead letter with the reason's code, writer
schemas evolve under Avro's resolution rules, and a registry that does not answer aborts instead of
dead-lettering good records."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer

from onceflow.decoding import avro_records
from onceflow.decoding.avro_records import pinned, registry_for
from onceflow.decoding.records import (
    DEAD_LETTER_CODES,
    DeadLetter,
    KafkaRecord,
    RowDecoder,
    row_columns,
    spark_schema,
)
from onceflow.decoding.schema_registry import (
    FolderSchemaRegistry,
    HttpSchemaRegistry,
    RegisteredSchema,
    RegistryUnavailable,
    SchemaNotFound,
    wire_value,
)
from onceflow.errors import ConfigError
from onceflow.pipeline import AvroFormat, KafkaSource, Pipeline, SinkSpec

# The reader's schema: what the pipeline's rows hold.
ORDER_V2 = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "price", "type": "double"},
        {"name": "note", "type": "string", "default": "none"},
        {"name": "coupon", "type": ["null", "string"], "default": None},
    ],
}
# An older writer: int and float (widened by the reader), no note (the reader's default), one field the
# reader no longer has.
ORDER_V1 = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "price", "type": "float"},
        {"name": "legacy", "type": "string"},
        {"name": "coupon", "type": ["null", "string"]},
    ],
}
# A writer whose id is text: no Avro resolution makes it a long.
ORDER_TEXT_ID = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "string"}, {"name": "price", "type": "double"}],
}
# A writer whose price may be null, which the reader requires.
ORDER_NULLABLE_PRICE = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "long"}, {"name": "price", "type": ["null", "double"]}],
}
LOGICAL = {
    "type": "record",
    "name": "Payment",
    "fields": [
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "at_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "raw", "type": "bytes"},
        {"name": "ok", "type": "boolean"},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["CARD", "CASH"]}},
        {"name": "memo", "type": ["null", "string"]},
    ],
}
IDS = {1: ORDER_V1, 2: ORDER_V2, 3: ORDER_TEXT_ID, 4: ORDER_NULLABLE_PRICE, 7: LOGICAL}


def body(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, parse_schema(schema), record)
    return out.getvalue()


def framed(schema_id: int, record: dict[str, Any]) -> bytes:
    """The schema registry wire format: magic byte 0, big-endian id, body."""
    return wire_value(schema_id, parse_schema(IDS[schema_id]), record)


def schema_folder(folder: Path, ids: dict[int, dict[str, Any]]) -> Path:
    entries = []
    for schema_id, schema in ids.items():
        (folder / f"s{schema_id}.avsc").write_text(json.dumps(schema))
        subject = "payments-value" if schema is LOGICAL else "orders-value"
        entries.append(
            {"id": schema_id, "subject": subject, "version": schema_id, "file": f"s{schema_id}.avsc"}
        )
    (folder / "registry.json").write_text(json.dumps({"schemas": entries}))
    return folder


@pytest.fixture
def registry(tmp_path: Path) -> FolderSchemaRegistry:
    return FolderSchemaRegistry(schema_folder(tmp_path, IDS))


def avsc(tmp_path: Path, schema: dict[str, Any], name: str = "reader.avsc") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(schema))
    return str(path)


def record(value: bytes | None, offset: int = 5, key: bytes | None = b"k") -> KafkaRecord:
    return KafkaRecord("orders", 0, offset, 1_700_000_000_000, key, value)


def decode(fmt: AvroFormat, registry: Any, value: bytes | None, key: bytes | None = b"k") -> Any:
    return RowDecoder(fmt, 1_000_000, registry).decode_row(record(value, key=key))


def reason(decoded: Any) -> str:
    assert isinstance(decoded, DeadLetter), decoded
    assert decoded.code in DEAD_LETTER_CODES
    return decoded.reason


def test_a_good_record_is_the_reader_schemas_fields_plus_the_metadata(
    tmp_path: Path, registry: FolderSchemaRegistry
) -> None:
    fmt = AvroFormat(schema_file=avsc(tmp_path, ORDER_V2), key_field="order_key")
    row = decode(fmt, registry, framed(2, {"id": 7, "price": 9.5, "note": "gift", "coupon": None}))
    assert row == {
        "id": 7,
        "price": 9.5,
        "note": "gift",
        "coupon": None,
        "order_key": "k",
        "_topic": "orders",
        "_partition": 0,
        "_offset": 5,
        "_timestamp": 1_700_000_000_000,
    }


def test_an_older_writer_is_read_with_avro_resolution(tmp_path: Path, registry: FolderSchemaRegistry) -> None:
    """Field added with a default, field removed, int widened to long and float to double."""
    fmt = AvroFormat(schema_file=avsc(tmp_path, ORDER_V2))
    row = decode(fmt, registry, framed(1, {"id": 3, "price": 1.5, "legacy": "x", "coupon": "C10"}))
    assert isinstance(row, dict)
    assert (row["id"], row["price"], row["note"], row["coupon"]) == (3, 1.5, "none", "C10")
    assert type(row["id"]) is int and type(row["price"]) is float
    assert "legacy" not in row


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b"\x01\x00\x00\x00\x02rest", "bad_magic_byte: expected 0x00 then a 4-byte schema id, found 0x01"),
        (b"", "bad_magic_byte: expected 0x00 then a 4-byte schema id, found an empty value"),
        (b"\x00\x00\x00", "malformed_avro: 3 bytes, shorter than the 5-byte header"),
        (b"\x00\x00\x00\x00\x63" + b"\x02", "unknown_schema_id: the schema registry has no schema id 99"),
        (
            framed(2, {"id": 1, "price": 2.0, "note": "n", "coupon": None})[:-3],
            "malformed_avro: writer schema id 2",
        ),
        (framed(2, {"id": 1, "price": 2.0, "note": "n", "coupon": None}) + b"\x00\x00", "2 bytes left after"),
        (framed(3, {"id": "A-1", "price": 2.0}), "incompatible_schema: writer schema id 3 does not resolve"),
        (framed(4, {"id": 1, "price": None}), "null_field: field 'price' is null (writer schema id 4)"),
    ],
)
def test_each_bad_record_is_one_dead_letter_with_its_code(
    tmp_path: Path, registry: FolderSchemaRegistry, value: bytes, expected: str
) -> None:
    fmt = AvroFormat(schema_file=avsc(tmp_path, ORDER_V2))
    decoded = decode(fmt, registry, value)
    assert expected in reason(decoded)
    assert decoded.offset == 5 and decoded.value == value


def test_a_writer_with_a_nullable_field_decodes_while_its_values_are_not_null(
    tmp_path: Path, registry: FolderSchemaRegistry
) -> None:
    fmt = AvroFormat(schema_file=avsc(tmp_path, ORDER_V2))
    row = decode(fmt, registry, framed(4, {"id": 1, "price": 4.25}))
    assert isinstance(row, dict) and row["price"] == 4.25


def test_a_tombstone_and_a_missing_key_keep_their_codes(
    tmp_path: Path, registry: FolderSchemaRegistry
) -> None:
    fmt = AvroFormat(schema_file=avsc(tmp_path, ORDER_V2), key_field="k")
    assert reason(decode(fmt, registry, None)).startswith("null_value:")
    good = framed(2, {"id": 1, "price": 2.0, "note": "n", "coupon": None})
    assert reason(decode(fmt, registry, good, key=None)).startswith("missing_key:")


def test_logical_types_become_python_values_and_typed_columns(
    tmp_path: Path, registry: FolderSchemaRegistry
) -> None:
    fmt = AvroFormat(schema_file=avsc(tmp_path, LOGICAL))
    ref = uuid.UUID("12345678-1234-5678-1234-567812345678")
    at = dt.datetime(2026, 11, 25, 12, 30, 1, 250_000, tzinfo=dt.UTC)
    at_us = dt.datetime(2026, 11, 25, 12, 30, 1, 123_456, tzinfo=dt.UTC)
    written = {
        "amount": decimal.Decimal("12.34"),
        "at_ms": at,
        "at_us": at_us,
        "day": dt.date(2026, 11, 25),
        "ref": ref,
        "raw": b"\x00\xff",
        "ok": True,
        "kind": "CASH",
        "memo": None,
    }
    row = decode(fmt, registry, framed(7, written))
    assert isinstance(row, dict)
    assert row["amount"] == decimal.Decimal("12.34") and isinstance(row["amount"], decimal.Decimal)
    assert row["at_ms"] == at and row["at_us"] == at_us
    assert row["day"] == dt.date(2026, 11, 25)
    assert row["ref"] == str(ref)
    assert (row["raw"], row["ok"], row["kind"], row["memo"]) == (b"\x00\xff", True, "CASH", None)
    columns = {name: (kind, nullable) for name, kind, nullable in row_columns(fmt)}
    assert columns["amount"] == ("decimal(10,2)", False)
    assert columns["at_ms"] == columns["at_us"] == ("timestamp", False)
    assert columns["day"] == ("date", False)
    assert columns["ref"] == columns["kind"] == ("string", False)
    assert columns["memo"] == ("string", True)
    spark = {f.name: f.dataType.simpleString() for f in spark_schema(fmt).fields}
    assert (spark["amount"], spark["at_ms"], spark["day"], spark["raw"]) == (
        "decimal(10,2)",
        "timestamp",
        "date",
        "binary",
    )


def test_plain_bodies_are_read_with_the_reader_schema_or_the_given_writer_schema(tmp_path: Path) -> None:
    same = AvroFormat(schema_file=avsc(tmp_path, ORDER_V2), wire="plain")
    row = decode(same, None, body(ORDER_V2, {"id": 1, "price": 2.0, "note": "n", "coupon": "c"}))
    assert isinstance(row, dict) and (row["id"], row["coupon"]) == (1, "c")
    older = AvroFormat(
        schema_file=avsc(tmp_path, ORDER_V2),
        wire="plain",
        writer_schema_file=avsc(tmp_path, ORDER_V1, "v1.avsc"),
    )
    row = decode(older, None, body(ORDER_V1, {"id": 2, "price": 0.5, "legacy": "", "coupon": None}))
    assert isinstance(row, dict) and (row["id"], row["note"]) == (2, "none")
    # A plain body has no header: a registry-framed value is not this schema's body.
    assert reason(
        decode(same, None, framed(2, {"id": 1, "price": 2.0, "note": "n", "coupon": None}))
    ).startswith("malformed_avro:")


@pytest.mark.parametrize("first", ["double", "float", "boolean", "long", "string"])
def test_an_empty_plain_body_has_one_reason_whatever_the_first_field(tmp_path: Path, first: str) -> None:
    """fastavro names its stream object, address included, for some types: the reason must not vary."""
    schema = {"type": "record", "name": "R", "fields": [{"name": "x", "type": first}]}
    fmt = AvroFormat(schema_file=avsc(tmp_path, schema), wire="plain")
    assert reason(decode(fmt, None, b"")) == "malformed_avro: writer schema of the format: the body is empty"


def test_a_truncated_body_is_reasoned_without_a_memory_address(tmp_path: Path) -> None:
    fmt = AvroFormat(schema_file=avsc(tmp_path, ORDER_V2), wire="plain")
    truncated = body(ORDER_V2, {"id": 1, "price": 2.0, "note": "n", "coupon": None})[:3]
    reasons = {reason(decode(fmt, None, truncated)) for _ in range(3)}
    assert len(reasons) == 1
    (text,) = reasons
    assert text.startswith("malformed_avro: writer schema of the format: body does not decode (")
    assert " at 0x" not in text


class CountingRegistry:
    """A registry that counts the look-ups it answers (from a folder of schemas)."""

    def __init__(self, inner: FolderSchemaRegistry, cache_key: str | None) -> None:
        self.inner, self.asked = inner, 0
        if cache_key is not None:
            self.cache_key = cache_key

    def schema_by_id(self, schema_id: int) -> str:
        self.asked += 1
        return self.inner.schema_by_id(schema_id)

    def latest(self, subject: str) -> RegisteredSchema:
        return self.inner.latest(subject)

    def versions(self, subject: str) -> list[RegisteredSchema]:
        return self.inner.versions(subject)


def test_writer_schemas_are_looked_up_once_per_process(
    tmp_path: Path, registry: FolderSchemaRegistry
) -> None:
    fmt = AvroFormat(schema_file=avsc(tmp_path, ORDER_V2))
    counting = CountingRegistry(registry, cache_key=f"test-{uuid.uuid4()}")
    value = framed(1, {"id": 3, "price": 1.5, "legacy": "x", "coupon": None})
    for _ in range(3):  # three tasks of one process, each with its decoder, many records each
        decoder = RowDecoder(fmt, 1_000_000, counting)
        for offset in range(10):
            assert not isinstance(decoder.decode(record(value, offset)), DeadLetter)
    assert counting.asked == 1
    # An unknown id is asked once per decoder, not once per record.
    unknown = CountingRegistry(registry, cache_key=None)
    decoder = RowDecoder(fmt, 1_000_000, unknown)
    for offset in range(10):
        assert reason(decoder.decode_row(record(b"\x00\x00\x00\x00\x63\x02", offset))).startswith(
            "unknown_schema_id"
        )
    assert unknown.asked == 1


def test_an_unreachable_registry_aborts_instead_of_dead_lettering(tmp_path: Path) -> None:
    import socket

    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://reader:s3cret@127.0.0.1:{port}"
    fmt = AvroFormat(schema_file=avsc(tmp_path, ORDER_V2))
    decoder = RowDecoder(fmt, 1_000_000, HttpSchemaRegistry(url, timeout_s=2, allow_insecure_auth=True))
    with pytest.raises(RegistryUnavailable) as raised:
        decoder.decode(record(framed(2, {"id": 1, "price": 2.0, "note": "n", "coupon": None})))
    message = str(raised.value)
    assert "\n" not in message and "s3cret" not in message
    assert f"schema registry http://reader:***@127.0.0.1:{port} is unreachable for schema id 2" in message


def test_registry_wire_needs_a_registry(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="ONCEFLOW_SCHEMA_REGISTRY_URL"):
        RowDecoder(AvroFormat(schema_file=avsc(tmp_path, ORDER_V2)), 1000, None)


@pytest.mark.parametrize(
    ("field_type", "message"),
    [
        ("Elsewhere", "type 'Elsewhere' has no row column \\(named types must be inline\\)"),
        ("R", "recursive reference to 'R'"),
        ({"type": "record", "name": "In", "fields": []}, "a nested record needs at least one field"),
        ({"type": "array", "items": "null"}, "field 'x\\[\\]': type 'null' alone has no row column"),
        (["null", "int", "string"], "union"),
        (["int", "string"], "union"),
        ({"type": "int", "logicalType": "time-millis"}, "logical type 'time-millis'"),
    ],
)
def test_schemas_rows_cannot_hold_are_refused_in_one_line(
    tmp_path: Path, field_type: Any, message: str
) -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "x", "type": field_type}]}
    with pytest.raises(ConfigError, match=message) as raised:
        AvroFormat(schema_file=avsc(tmp_path, schema))
    assert "field 'x" in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda p: AvroFormat(), "schema_file or as subject, one of them"),
        (lambda p: AvroFormat(schema_file=p, subject="s"), "one of them"),
        (lambda p: AvroFormat(schema_file=p + ".missing"), "format.schema_file=.*cannot read it"),
        (lambda p: AvroFormat(schema_file=p, wire="framed"), "format.wire='framed'"),  # type: ignore[arg-type]
        (lambda p: AvroFormat(schema_file=p, writer_schema_file=p), "only with wire='plain'"),
        (lambda p: AvroFormat(schema_file=p, key_field="id"), "format.key_field='id': collides"),
    ],
)
def test_bad_avro_formats_are_refused_by_name(tmp_path: Path, build: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build(avsc(tmp_path, ORDER_V2))


def test_a_spec_carries_its_schemas_so_tasks_need_no_schema_file(tmp_path: Path) -> None:
    path = avsc(tmp_path, ORDER_V2)
    spec = Pipeline(
        "avro_orders",
        KafkaSource(("orders",)),
        AvroFormat(schema_file=path, key_field="k"),
        (SinkSpec("out", "files", {"root": str(tmp_path), "table": "t"}),),
    )
    Path(path).unlink()
    again = Pipeline.from_json(spec.to_json())
    assert again == spec
    assert [name for name, _, _ in row_columns(again.format)][:4] == ["id", "price", "note", "coupon"]


def test_a_subject_is_pinned_to_its_latest_schema_for_a_slice(tmp_path: Path) -> None:
    folder = schema_folder(tmp_path, {1: ORDER_V1, 2: ORDER_V2})
    spec = Pipeline(
        "avro_orders",
        KafkaSource(("orders",)),
        AvroFormat(subject="orders-value"),
        (SinkSpec("out", "files", {"root": str(tmp_path), "table": "t"}),),
    )
    with pytest.raises(ConfigError, match="not pinned yet"):
        row_columns(spec.format)
    url = f"file://{folder}"
    ready = pinned(spec, url)
    assert [name for name, _, _ in row_columns(ready.format)][:4] == ["id", "price", "note", "coupon"]
    assert Pipeline.from_json(ready.to_json()) == ready
    row = RowDecoder(ready.format, 1000, registry_for(url)).decode_row(
        record(framed(1, {"id": 3, "price": 1.5, "legacy": "x", "coupon": None}))
    )
    assert isinstance(row, dict) and row["note"] == "none"
    missing = Pipeline.from_dict({**spec.to_dict(), "format": {"type": "avro", "subject": "nope"}})
    with pytest.raises(ConfigError, match=r"format.subject='nope': schema folder .* has no subject 'nope'"):
        pinned(missing, url)
    with pytest.raises(ConfigError, match="needs a schema registry"):
        pinned(spec, None)


def test_the_folder_registry_answers_by_id_and_by_subject(registry: FolderSchemaRegistry) -> None:
    assert json.loads(registry.schema_by_id(1)) == ORDER_V1
    latest = registry.latest("orders-value")
    assert (latest.id, latest.version, json.loads(latest.schema)) == (4, 4, ORDER_NULLABLE_PRICE)
    with pytest.raises(SchemaNotFound):
        registry.schema_by_id(42)
    with pytest.raises(SchemaNotFound):
        registry.latest("nope")


def test_writer_schemas_cached_per_process_outlive_the_registry_file(tmp_path: Path) -> None:
    (tmp_path / "schemas").mkdir()
    folder = schema_folder(tmp_path / "schemas", {1: ORDER_V1})
    fmt = AvroFormat(schema_file=avsc(tmp_path, ORDER_V2))
    url = f"file://{folder}"
    value = framed(1, {"id": 3, "price": 1.5, "legacy": "x", "coupon": None})
    assert not isinstance(RowDecoder(fmt, 1000, registry_for(url)).decode(record(value)), DeadLetter)
    (folder / "s1.avsc").unlink()
    assert not isinstance(RowDecoder(fmt, 1000, registry_for(url)).decode(record(value)), DeadLetter)
    assert (f"file://{folder.resolve()}", 1) in avro_records._WRITERS


def test_a_version_added_to_the_folder_while_pipelines_run_is_found(tmp_path: Path) -> None:
    """As a producer registers a new version in a registry server: no good record may become an
    unknown_schema_id dead letter because a long-lived process read the manifest before."""
    folder = schema_folder(tmp_path, {1: ORDER_V1})
    registry = FolderSchemaRegistry(folder)
    assert registry.latest("orders-value").id == 1
    schema_folder(tmp_path, {1: ORDER_V1, 2: ORDER_V2})  # the person adds version 2
    assert json.loads(registry.schema_by_id(2)) == ORDER_V2
    assert registry.latest("orders-value").id == 2


def test_a_writer_schema_fastavro_cannot_use_is_asked_for_once_and_dead_letters_its_records(
    tmp_path: Path, registry: FolderSchemaRegistry
) -> None:
    (tmp_path / "s1.avsc").write_text(
        json.dumps({"type": "record", "name": "Order", "fields": [{"name": "id"}]})
    )
    counting = CountingRegistry(registry, cache_key=None)
    decoder = RowDecoder(AvroFormat(schema_file=avsc(tmp_path, ORDER_V2)), 1_000_000, counting)
    for offset in range(5):
        found = reason(decoder.decode_row(record(b"\x00\x00\x00\x00\x01\x02", offset)))
        assert found.startswith("incompatible_schema: writer schema id 1 is not a usable Avro schema")
    assert counting.asked == 1


def test_an_oversized_avro_record_is_dead_lettered_before_any_registry_look_up(
    tmp_path: Path, registry: FolderSchemaRegistry
) -> None:
    counting = CountingRegistry(registry, cache_key=None)
    decoder = RowDecoder(AvroFormat(schema_file=avsc(tmp_path, ORDER_V2)), 64, counting)
    value = framed(2, {"id": 1, "price": 2.0, "note": "x" * 100, "coupon": None})
    assert reason(decoder.decode_row(record(value))).startswith("oversized:")
    assert counting.asked == 0


def _bytes_field(unscaled: int) -> bytes:
    """An Avro ``bytes`` value holding ``unscaled`` as a big-endian two's complement integer."""
    data = unscaled.to_bytes((unscaled.bit_length() + 8) // 8, "big", signed=True)
    length, out = len(data) << 1, bytearray()  # a non-negative length's zig-zag varint
    while length > 0x7F:
        out.append((length & 0x7F) | 0x80)
        length >>= 7
    return bytes([*out, length]) + data


def test_a_decimal_wider_than_its_precision_is_a_dead_letter_not_a_rounded_value(tmp_path: Path) -> None:
    price = {"type": "bytes", "logicalType": "decimal", "precision": 5, "scale": 2}
    schema = {"type": "record", "name": "Price", "fields": [{"name": "p", "type": price}]}
    fmt = AvroFormat(schema_file=avsc(tmp_path, schema), wire="plain")
    row = decode(fmt, None, _bytes_field(12345))
    assert isinstance(row, dict) and row["p"] == decimal.Decimal("123.45")
    # Nine digits in a decimal(5,2): fastavro alone gives Decimal('1.2346E+6'), a value the column
    # cannot hold; it becomes a dead letter with its reason instead.
    assert reason(decode(fmt, None, _bytes_field(123456789))) == (
        "malformed_avro: field 'p': the unscaled value has more digits than decimal(5,2) holds"
    )


def test_a_folder_lists_a_subjects_versions_oldest_first(registry: FolderSchemaRegistry) -> None:
    versions = registry.versions("orders-value")
    assert [(v.id, v.version) for v in versions] == [(1, 1), (2, 2), (3, 3), (4, 4)]
    assert json.loads(versions[1].schema) == ORDER_V2
    with pytest.raises(SchemaNotFound):
        registry.versions("nobody")


def test_a_long_avro_reason_is_cut_to_about_200_characters_keeping_its_code(tmp_path: Path) -> None:
    """Avro names have no length limit: a null in a field of a 3,000-character name, deep in a record."""
    name = "f" * 3000
    inner = {"type": "record", "name": "Inner", "fields": [{"name": name, "type": "long"}]}
    reader = {"type": "record", "name": "R", "fields": [{"name": "outer", "type": inner}]}
    nullable = {"type": "record", "name": "Inner", "fields": [{"name": name, "type": ["null", "long"]}]}
    writer = {"type": "record", "name": "R", "fields": [{"name": "outer", "type": nullable}]}
    fmt = AvroFormat(
        schema_file=avsc(tmp_path, reader), wire="plain", writer_schema_file=avsc(tmp_path, writer, "w.avsc")
    )
    text = reason(decode(fmt, None, body(writer, {"outer": {name: None}})))
    assert len(text) <= 200
    assert text.startswith("null_field: field 'outer.ffff") and text.endswith("f…")

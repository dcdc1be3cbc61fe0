"""Debezium's JSON change events, as its PostgreSQL connector wrote them (tests/data/debezium/), read
into changes and rows: both JSON serializations give the same rows, Connect's decimal and time
encodings undone, deletes and tombstones keyed, and what is not a change event refused with its reason."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import pytest

from onceflow.decoding.debezium import Change, ChangeRejected, read_json_change, unscaled_decimal
from onceflow.decoding.records import DeadLetter, KafkaRecord, RowDecoder, change_row, row_columns
from onceflow.decoding.schema_registry import FolderSchemaRegistry
from onceflow.errors import ConfigError
from onceflow.pipeline import AvroFormat, Debezium, JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.protocol.planning import check_changes
from onceflow.schemas.types import parse_type

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "debezium"
# The source table: (id integer PRIMARY KEY, name text, qty integer, price numeric(10,2),
# updated_at timestamptz)
FIELDS = (
    ("id", parse_type("int")),
    ("name", parse_type("string?")),
    ("qty", parse_type("int?")),
    ("price", parse_type("decimal(10,2)?")),
    ("updated_at", parse_type("timestamp?")),
)


def _sample(serialization: str, kind: str) -> Change:
    folder = SAMPLES / serialization
    key, value = folder / f"{kind}.key.json", folder / f"{kind}.value.json"
    return read_json_change(
        key.read_bytes() if key.exists() else None, value.read_bytes() if value.exists() else None
    )


@pytest.mark.parametrize("kind", ["read", "create", "update", "delete", "create_after_add_column"])
def test_both_json_serializations_give_the_same_change_and_row(kind: str) -> None:
    wrapped, bare = _sample("json", kind), _sample("json-schemaless", kind)
    assert wrapped.op == bare.op
    row_wrapped, row_bare = change_row(wrapped, FIELDS), change_row(bare, FIELDS)
    # The two connectors ran at different moments: the same shape, the same key, values of one kind.
    assert set(row_wrapped) == set(row_bare) == {*(name for name, _ in FIELDS), "_op"}
    assert row_wrapped["_op"] == row_bare["_op"] == wrapped.op
    for row in (row_wrapped, row_bare):
        assert isinstance(row["id"], int)
        if wrapped.upsert:
            assert isinstance(row["price"], Decimal) and row["price"].as_tuple().exponent == -2
            assert isinstance(row["updated_at"], dt.datetime) and row["updated_at"].tzinfo is not None
        else:  # a delete keeps the key only
            assert [name for name, value in row.items() if value is not None] == ["id", "_op"]


def test_an_update_reads_the_after_image_exactly() -> None:
    update = _sample("json-schemaless", "update")
    document = json.loads((SAMPLES / "json-schemaless" / "update.value.json").read_text())
    row = change_row(update, FIELDS)
    after = document["after"]
    assert (row["id"], row["name"], row["qty"]) == (after["id"], after["name"], after["qty"])
    assert row["price"] == unscaled_decimal(after["price"], 2)
    assert row["updated_at"] == dt.datetime.fromisoformat(after["updated_at"].replace("Z", "+00:00"))
    assert update.transaction == str(document["source"]["txId"])


def test_a_tombstone_deletes_its_key_and_a_truncate_keys_nothing() -> None:
    for serialization in ("json", "json-schemaless"):
        tombstone = _sample(serialization, "tombstone")
        assert tombstone.op == "d" and tombstone.image is None
        row = change_row(tombstone, FIELDS)
        assert row["_op"] == "d" and row["id"] == _sample(serialization, "delete").key["id"]  # type: ignore[index]
        truncate = _sample(serialization, "truncate")
        assert truncate.op == "t" and change_row(truncate, FIELDS) == {
            **dict.fromkeys(dict(FIELDS)),
            "_op": "t",
        }


def test_connect_decimals_are_exact_at_any_sign_and_scale() -> None:
    assert unscaled_decimal("LuA=", 2) == Decimal("120.00")
    assert unscaled_decimal("/w==", 0) == Decimal(-1)
    assert unscaled_decimal("AA==", 3) == Decimal("0.000")
    with pytest.raises(ChangeRejected, match="malformed_change: decimal 'not base64!' is not base64"):
        unscaled_decimal("not base64!", 2)


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        (None, b"{", "malformed_change: the value is not JSON"),
        (None, b"[1, 2]", "malformed_change: the value is not a change event"),
        (None, b'{"op": "x", "after": {}}', 'malformed_change: op "x" is not one of'),
        (None, b'{"after": {"id": 1}}', "malformed_change: op none is not one of"),
        (b'{"id": 1}', b'{"op": "u", "after": null}', "malformed_change: op 'u' without an 'after' object"),
        (None, b'{"op": "c", "after": {"id": 1}}', "missing_key: a insert without a record key"),
    ],
)
def test_what_is_not_a_change_is_refused_with_its_reason(
    key: bytes | None, value: bytes, reason: str
) -> None:
    with pytest.raises(ChangeRejected) as refused:
        change_row(read_json_change(key, value), FIELDS)
    assert refused.value.reason.startswith(reason)


def test_named_key_fields_key_a_change_and_a_wrong_value_names_its_field() -> None:
    change = read_json_change(None, b'{"op": "c", "after": {"id": 7, "name": "x", "qty": "three"}}')
    with pytest.raises(ChangeRejected) as refused:
        change_row(change, FIELDS, key_fields=("id",))
    assert refused.value.reason.startswith("wrong_type: field 'qty': expected int")
    ok = read_json_change(None, b'{"op": "c", "after": {"id": 7, "name": "x", "price": "12.50"}}')
    assert change_row(ok, FIELDS, ("id",), decimals="string")["price"] == Decimal("12.50")
    keyless = read_json_change(b'{"id": 7}', b'{"op": "d", "before": null}')
    with pytest.raises(
        ChangeRejected, match=r"missing_key: a delete without a value for key field\(s\) \['name'\]"
    ):
        change_row(keyless, FIELDS, ("name",))


def _format(**changes: object) -> JsonFormat:
    schema = {
        "id": "int",
        "name": "string?",
        "qty": "int?",
        "price": "decimal(10,2)?",
        "updated_at": "timestamp",
    }
    return JsonFormat(schema=schema, changes=Debezium(**changes))  # type: ignore[arg-type]


def test_a_change_stream_format_decodes_each_event_into_a_row_with_its_op() -> None:
    fmt = _format(key=("id",))
    columns = row_columns(fmt)
    assert [c[0] for c in columns][:7] == ["id", "name", "qty", "price", "updated_at", "_op", "_topic"]
    assert [c[2] for c in columns][:6] == [False, True, True, True, True, False]  # deletes null the rest
    decoder = RowDecoder(fmt, 1_000_000)
    ops = []
    for offset, kind in enumerate(("read", "create", "update", "delete", "tombstone", "truncate")):
        for serialization in ("json", "json-schemaless"):
            folder = SAMPLES / serialization
            key, value = folder / f"{kind}.key.json", folder / f"{kind}.value.json"
            record = KafkaRecord(
                "t",
                0,
                offset,
                None,
                key.read_bytes() if key.exists() else None,
                value.read_bytes() if value.exists() else None,
            )
            row = decoder.decode_row(record)
            assert isinstance(row, dict), row
            assert (row["_offset"] == offset and row["id"] is not None) or row["_op"] == "t"
            ops.append(row["_op"])
    assert ops == ["r", "r", "c", "c", "u", "u", "d", "d", "d", "d", "t", "t"]
    letter = decoder.decode_row(
        KafkaRecord("t", 0, 9, None, b'{"id": 1}', b'{"op": "c", "after": {"id": "x"}}')
    )
    assert isinstance(letter, DeadLetter) and letter.reason.startswith("wrong_type: field 'id': expected int")


def test_the_change_option_travels_with_the_spec_and_is_checked() -> None:
    spec = Pipeline(
        name="mirror",
        source=KafkaSource(topics=("t",)),
        format=_format(key=("id",), decimals="string"),
        sinks=(SinkSpec("log", "files", {"root": "/tmp/unused", "table": "t"}),),
    )
    again = Pipeline.from_json(spec.to_json())
    assert again == spec and again.format.changes == Debezium(key=("id",), decimals="string")  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="key fields must be fields of the schema"):
        _format(key=("nope",))
    with pytest.raises(ConfigError, match=r"format\.changes\.decimals"):
        _format(decimals="double")
    with pytest.raises(ConfigError, match="is the change's op column"):
        JsonFormat(schema={"id": "int", "_op": "string"}, changes=Debezium())
    # A sink that would drop the op is refused before anything runs; one that keeps it is not.
    narrowing = SinkSpec("pg", "postgres_2pc", {"table": "t", "columns": {"id": "bigint", "name": "text"}})
    with pytest.raises(ConfigError, match=r"sink 'pg' \(postgres_2pc\) would take the change events' rows"):
        check_changes(replace(spec, sinks=(narrowing,)))
    keeping = SinkSpec("pg", "postgres_2pc", {"table": "t", "columns": {"id": "bigint", "_op": "text"}})
    check_changes(replace(spec, sinks=(keeping,)))


AVRO = SAMPLES / "avro"


def _avro_record(kind: str, offset: int) -> KafkaRecord:
    key, value = AVRO / f"{kind}.key.bin", AVRO / f"{kind}.value.bin"
    return KafkaRecord(
        "t",
        0,
        offset,
        None,
        key.read_bytes() if key.exists() else None,
        value.read_bytes() if value.exists() else None,
    )


@pytest.mark.parametrize("key", [("id",), ()])
def test_debezium_avro_events_through_the_registry_become_the_same_rows(key: tuple[str, ...]) -> None:
    """The envelope's latest schema (after a column was added) reads every event, old and new; the key
    is named, or else the record key's (Avro of the key subject, read for tombstones and deletes)."""
    fmt = AvroFormat(schema_file=str(AVRO / "schema-23.avsc"), changes=Debezium(key=key))
    assert [c[0] for c in row_columns(fmt)][:7] == ["id", "name", "qty", "price", "updated_at", "note", "_op"]
    decoder = RowDecoder(fmt, 1_000_000, FolderSchemaRegistry(str(AVRO)))
    decoded = json.loads((AVRO / "decoded.json").read_text())
    kinds = ["read", "create", "update", "delete", "tombstone", "create_after_add_column", "truncate"]
    for offset, kind in enumerate(kinds):
        row = decoder.decode_row(_avro_record(kind, offset))
        assert isinstance(row, dict), (kind, row)
        event = decoded[kind]
        if event is None:  # the tombstone: a delete of the delete's key
            assert (row["_op"], row["id"], row["name"]) == ("d", decoded["delete"]["before"]["id"], None)
            continue
        assert row["_op"] == event["op"]
        if event["op"] in ("c", "u", "r"):
            after = event["after"]
            assert (row["id"], row["name"], row["qty"]) == (after["id"], after["name"], after["qty"])
            assert row["price"] == Decimal(after["price"]["decimal"]) and row["note"] == after.get("note")
        elif event["op"] == "d":
            assert row["id"] == event["before"]["id"] and row["name"] is None and row["qty"] is None
        else:
            assert [v for k, v in row.items() if not k.startswith("_")] == [None] * 6
    garbage = decoder.decode_row(KafkaRecord("t", 0, 9, None, None, b"\x00\x00\x00\x00\x17\x99"))
    assert isinstance(garbage, DeadLetter) and garbage.reason.startswith("malformed_avro")


def test_an_avro_change_format_needs_a_change_events_schema() -> None:
    with pytest.raises(ConfigError, match="not a Debezium change event's schema"):
        AvroFormat(schema_file=str(AVRO / "schema-21.avsc"), changes=Debezium())
    with pytest.raises(ConfigError, match="key fields must be fields of the change's rows"):
        AvroFormat(schema_file=str(AVRO / "schema-23.avsc"), changes=Debezium(key=("nope",)))
    spec = Pipeline(
        name="mirror",
        source=KafkaSource(topics=("t",)),
        format=AvroFormat(schema_file=str(AVRO / "schema-23.avsc"), changes=Debezium(key=("id",))),
        sinks=(SinkSpec("log", "files", {"root": "/tmp/unused", "table": "t"}),),
    )
    assert Pipeline.from_json(spec.to_json()) == spec

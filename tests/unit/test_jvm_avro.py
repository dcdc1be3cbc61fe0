"""Which Avro writer schemas the JVM may decode, and how it resolves them to the reader schema.

The planning is pure Python; that the JVM then decodes exactly as fastavro does is shown on Spark by
``tests/integration/engine/test_avro_conformance.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from onceflow.decoding.schema_registry import FolderSchemaRegistry
from onceflow.engine.jvm_avro import NotPlanned, WriterPlan, writer_plan, writer_plans
from onceflow.pipeline import AvroFormat


def record(*fields: dict[str, Any], name: str = "Order", **extra: Any) -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": list(fields), **extra}


def field(name: str, avro_type: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": avro_type, **extra}


DECIMAL = {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3}
V1 = record(field("id", "long"), field("price", "double"))
V2 = record(
    field("id", "long"),
    field("price", "double"),
    field("note", "string", default="none"),
    field("coupon", ["null", "string"], default=None),
)


def plan(reader: dict[str, Any], writer: dict[str, Any], schema_id: int | None = 1) -> WriterPlan:
    return writer_plan(json.dumps(reader), json.dumps(writer), schema_id)


def not_planned(reader: dict[str, Any], writer: dict[str, Any]) -> str:
    with pytest.raises(NotPlanned) as caught:
        plan(reader, writer)
    return str(caught.value)


def test_the_writers_own_schema_is_decoded_with_a_sentinel_field_defaulting_to_true() -> None:
    got = plan(V2, V2)
    assert [(c.name, c.source, c.nullable) for c in got.columns] == [
        ("id", "id", False),
        ("price", "price", False),
        ("note", "note", False),
        ("coupon", "coupon", True),
    ]
    written, decoded = json.loads(got.writer_json), json.loads(got.decode_json)
    assert [f["name"] for f in written["fields"]] == ["id", "price", "note", "coupon"]
    assert decoded["fields"][:-1] == written["fields"]
    assert decoded["fields"][-1] == {"name": got.sentinel, "type": "boolean", "default": True}


def test_the_sentinel_never_takes_a_writer_fields_name() -> None:
    writer = record(field("id", "long"), field("_onceflow_decoded", "boolean"))
    got = plan(record(field("id", "long")), writer)
    assert got.sentinel not in {"id", "_onceflow_decoded"}


def test_an_older_writer_gets_the_readers_defaults() -> None:
    got = plan(V2, V1)
    assert [(c.name, c.source, c.default) for c in got.columns] == [
        ("id", "id", None),
        ("price", "price", None),
        ("note", None, "none"),
        ("coupon", None, None),
    ]
    # The writer's fields are what the JVM decodes: the reader's defaults are not in its schema.
    assert [f.name for f in got.fields] == ["id", "price"]


def test_a_newer_writers_extra_fields_are_decoded_and_skipped() -> None:
    got = plan(V1, V2)
    assert [f.name for f in got.fields] == ["id", "price", "note", "coupon"]
    assert [c.source for c in got.columns] == ["id", "price"]


def test_nullability_may_differ_the_value_decides() -> None:
    writer = record(field("id", "long"), field("price", ["null", "double"]))
    got = plan(V1, writer)
    assert [(c.name, c.nullable) for c in got.columns] == [("id", False), ("price", False)]
    assert [f.nullable for f in got.fields] == [False, True]
    reader = record(field("id", "long"), field("price", ["double", "null"]))
    assert [c.nullable for c in plan(reader, V1).columns] == [False, True]


@pytest.mark.parametrize(
    ("reader", "writer", "why"),
    [
        (V2, record(field("id", "long")), "'price' is not in the writer schema and has no default"),
        (V1, record(field("id", "int"), field("price", "double")), "'id' has another type"),
        (V1, record(field("id", "long"), field("price", "float")), "'price' has another type"),
        (V1, record(field("id", "long"), field("price", "double"), name="Other"), "record name"),
        (V1, record(field("id", "long"), field("price", "double"), namespace="x"), "namespace"),
        (record(field("id", "long", aliases=["key"])), V1, "aliases"),
        (
            record(field("id", "long"), field("f", "float", default=0.1)),
            V1,
            "a default the decoders may read differently",
        ),
        (
            record(
                field("id", "long"),
                field("at", {"type": "long", "logicalType": "timestamp-millis"}, default=0),
            ),
            V1,
            "a default the decoders may read differently",
        ),
        (record(field("id", "long"), field("b", "bytes", default="")), V1, "default"),
        (record(field("id", "long"), field("n", ["null", "long"], default=3)), V1, "union's default"),
        (record(field("id", "long"), field("n", ["long", "null"], default=3)), V1, "union's default"),
        (V1, record(*V1["fields"], field("tags", {"type": "array", "items": "string"})), "nested"),
        (V1, record(*V1["fields"], field("o", ["null", "long", "string"])), "a union other than"),
        (V1, record(*V1["fields"], field("t", {"type": "int", "logicalType": "time-millis"})), "time-millis"),
        (
            V1,
            record(
                *V1["fields"],
                field("e", {"type": "enum", "name": "E", "symbols": ["A"]}),
                field("f", "E"),
            ),
            "a named type is decoded in Python",
        ),
    ],
)
def test_writers_the_decoders_could_read_differently_go_to_python(
    reader: dict[str, Any], writer: dict[str, Any], why: str
) -> None:
    assert why in not_planned(reader, writer)


def test_logical_types_must_match_exactly_parameters_alike() -> None:
    reader = record(field("amount", DECIMAL))
    assert plan(reader, reader).fields[0].type.precision == 12
    other_scale = record(field("amount", {**DECIMAL, "scale": 2}))
    assert "another type" in not_planned(reader, other_scale)
    plain_bytes = record(field("amount", "bytes"))
    assert "another type" in not_planned(reader, plain_bytes)
    millis = record(field("at", {"type": "long", "logicalType": "timestamp-millis"}))
    micros = record(field("at", {"type": "long", "logicalType": "timestamp-micros"}))
    assert "another type" in not_planned(millis, micros)
    enum = record(field("k", {"type": "enum", "name": "K", "symbols": ["A", "B"]}))
    reordered = record(field("k", {"type": "enum", "name": "K", "symbols": ["B", "A"]}))
    assert "another type" in not_planned(enum, reordered)


def test_a_fixed_decimal_spark_would_truncate_goes_to_python() -> None:
    def fixed(size: int, precision: int) -> dict[str, Any]:
        decimal = {"type": "fixed", "name": "D", "size": size, "logicalType": "decimal"}
        return record(field("d", {**decimal, "precision": precision, "scale": 2}))

    assert plan(fixed(8, 18), fixed(8, 18)).fields[0].type.size == 8
    assert plan(fixed(16, 30), fixed(16, 30)).fields[0].type.precision == 30
    assert "fixed decimal of 9 bytes" in not_planned(fixed(9, 18), fixed(9, 18))
    assert not_planned(fixed(2, 5), fixed(2, 5))  # 2 bytes hold 4 digits, not 5 (fastavro says so too)


def test_only_what_both_decoders_read_is_given_to_spark() -> None:
    writer = record(
        field("s", {"type": "string", "avro.java.string": "String"}, doc="text"),
        field("u", {"type": "string", "logicalType": "uuid"}),
        field("x", {"type": "long", "logicalType": "no-such-type"}),
        doc="an order",
    )
    reader = record(field("s", "string"), field("u", {"type": "string", "logicalType": "uuid"}))
    assert "'no-such-type'" in not_planned(reader, writer)
    del writer["fields"][2]
    written = json.loads(plan(reader, writer).writer_json)
    assert written == {
        "type": "record",
        "name": "Order",
        "fields": [
            {"name": "s", "type": {"type": "string"}},
            {"name": "u", "type": {"type": "string", "logicalType": "uuid"}},
        ],
    }


def schema_folder(folder: Path, entries: list[tuple[int, str, int, dict[str, Any]]]) -> str:
    manifest = []
    for schema_id, subject, version, schema in entries:
        (folder / f"{schema_id}.avsc").write_text(json.dumps(schema))
        manifest.append(
            {"id": schema_id, "subject": subject, "version": version, "file": f"{schema_id}.avsc"}
        )
    (folder / "registry.json").write_text(json.dumps({"schemas": manifest}))
    return str(folder)


def test_the_driver_plans_the_subjects_versions_and_says_why_not_the_others(tmp_path: Path) -> None:
    renamed = record(*V1["fields"], name="Renamed")
    registry = FolderSchemaRegistry(
        schema_folder(
            tmp_path,
            [
                (3, "orders-value", 1, V1),
                (8, "orders-value", 2, V2),
                (9, "orders-value", 3, renamed),
                (4, "other-value", 1, V1),
            ],
        )
    )
    fmt = AvroFormat(subject="orders-value").pin(json.dumps(V2))
    plans, notes = writer_plans(fmt, registry, ["orders"])
    assert [p.schema_id for p in plans] == [3, 8]
    assert len(notes) == 1 and notes[0].startswith("schema id 9: ")
    # A reader schema from a file: the topics' ``<topic>-value`` subjects, those the registry has.
    reader = tmp_path / "reader.avsc"
    reader.write_text(json.dumps(V2))
    from_file = AvroFormat(schema_file=str(reader))
    plans, _ = writer_plans(from_file, registry, ["orders", "other", "absent"])
    assert [p.schema_id for p in plans] == [3, 4, 8]
    assert writer_plans(from_file, None, ["orders"]) == ([], ["no schema registry is named"])


def test_a_plain_body_has_the_one_writer_schema(tmp_path: Path) -> None:
    reader, writer = tmp_path / "reader.avsc", tmp_path / "writer.avsc"
    reader.write_text(json.dumps(V2))
    writer.write_text(json.dumps(V1))
    plans, notes = writer_plans(AvroFormat(schema_file=str(reader), wire="plain"), None, ["t"])
    assert [(p.schema_id, [f.name for f in p.fields]) for p in plans] == [
        (None, ["id", "price", "note", "coupon"])
    ]
    older = AvroFormat(schema_file=str(reader), wire="plain", writer_schema_file=str(writer))
    assert [c.source for c in writer_plans(older, None, ["t"])[0][0].columns] == ["id", "price", None, None]
    writer.write_text(json.dumps(record(field("id", "int"), field("price", "double"))))
    promoted = AvroFormat(schema_file=str(reader), wire="plain", writer_schema_file=str(writer))
    plans, notes = writer_plans(promoted, None, ["t"])
    assert plans == [] and "'id' has another type" in notes[0]

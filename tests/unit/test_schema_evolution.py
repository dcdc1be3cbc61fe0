"""Reader schemas that change between epochs: what is taken, what is refused at plan time (and named),
and what the Iceberg sink adds, at any depth, with the ids it had kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from onceflow.config import Settings
from onceflow.errors import ConfigError
from onceflow.ledger import Ledger
from onceflow.pipeline import AvroFormat, JsonFormat, KafkaSource, Pipeline, SinkSpec, nullable
from onceflow.protocol.schema_changes import check_reader_schema, reader_row_type
from onceflow.schemas.avro import defaulted_fields
from onceflow.schemas.evolution import compare
from onceflow.schemas.types import Struct, parse_type


def _struct(text: str) -> Struct:
    t = parse_type(text)
    assert isinstance(t, Struct)
    return t


V1 = "struct<id:int,items:array<struct<sku:string,qty:int>>,ctx:struct<ip:string?>?,price:decimal(10,2)>"


def test_new_nullable_fields_are_taken_at_any_depth_and_widenings_pass() -> None:
    v2 = (
        "struct<id:int,items:array<struct<sku:string,qty:float,note:string?>>,"
        "ctx:struct<ip:string?,agent:struct<name:string>?>?,price:decimal(12,2)?,coupon:string?>"
    )
    change = compare(_struct(V1), _struct(v2))
    assert change.refused == []
    assert change.added == ["items[].note", "ctx.agent", "coupon"]
    assert change.widened == ["items[].qty", "price", "price"]  # nullable, then more digits
    assert not compare(_struct(V1), _struct(V1)).changed


@pytest.mark.parametrize(
    ("v2", "named"),
    [
        # renamed: the old name is gone, the new one is required without a default
        (V1.replace("id:int", "order_id:int"), ["id (int) is gone", "order_id (int) is new and required"]),
        (V1.replace("qty:int", "qty:string"), ["items[].qty changed type from int to string"]),
        (V1.replace("ctx:struct<ip:string?>?", "ctx:struct<ip:string>?"), ["ctx.ip may no longer be null"]),
        (V1.replace("price:decimal(10,2)", "price:decimal(10,3)"), ["price changed type"]),
        (V1.replace("qty:int", "qty:int,unit:string"), ["items[].unit (string) is new and required"]),
        (V1.replace("items:array<struct<sku:string,qty:int>>", "items:map<string,int>"), ["items changed"]),
    ],
)
def test_incompatible_changes_are_refused_naming_each_field(v2: str, named: list[str]) -> None:
    refused = compare(_struct(V1), _struct(v2)).refused
    assert len(refused) == len(named)
    for line, words in zip(refused, named, strict=True):
        assert line.startswith(words) and "\n" not in line


def test_an_avro_field_with_a_default_may_be_new_and_required() -> None:
    schema = {
        "type": "record",
        "name": "Order",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "channel", "type": "string", "default": "web"},
            {
                "name": "items",
                "type": {
                    "type": "array",
                    "items": {
                        "type": "record",
                        "name": "Item",
                        "fields": [
                            {"name": "qty", "type": "long", "default": 1},
                            {"name": "sku", "type": "string"},
                        ],
                    },
                },
            },
            {
                "name": "attrs",
                "type": {
                    "type": "map",
                    "values": {
                        "type": "record",
                        "name": "A",
                        "fields": [{"name": "n", "type": ["null", "long"], "default": None}],
                    },
                },
            },
        ],
    }
    assert defaulted_fields(schema) == {"channel", "items[].qty", "attrs{}.n"}
    old = _struct("struct<id:int,items:array<struct<sku:string>>>")
    new = _struct("struct<id:int,channel:string,items:array<struct<qty:int,sku:string>>>")
    assert compare(old, new).refused  # without the defaults: required and new
    change = compare(old, new, defaulted_fields(schema))
    assert change.refused == [] and change.added == ["items[].qty", "channel"]


def _pipeline(schema: dict[str, Any]) -> Pipeline:
    return Pipeline(
        name="evolving",
        source=KafkaSource(topics=("t",)),
        format=JsonFormat(schema=schema),
        sinks=(SinkSpec("out", "files", {"root": "/tmp/unused", "table": "t"}),),
    )


def test_each_plan_compares_with_the_schema_the_last_planned_epoch_recorded(tmp_path: Path) -> None:
    ledger = Ledger.connect(f"sqlite:///{tmp_path / 'ledger.db'}", check=False)
    ledger.upgrade()
    settings = Settings.from_env()
    v1 = _pipeline({"id": "int", "items": [{"sku": "string"}]})
    first = check_reader_schema(v1, ledger, settings)
    assert first.change is None and first.lines("evolving") == []
    ledger.plan_epoch("evolving", [], [], reader_schema=first.text)
    assert ledger.reader_schema("evolving") == first.text == "struct<id:int,items:array<struct<sku:string>>>"

    v2 = _pipeline(
        {"id": "int", "items": [{"sku": "string", "note": "string?"}], "ctx": nullable({"ip": "string"})}
    )
    taken = check_reader_schema(v2, ledger, settings)
    assert taken.change is not None and taken.change.added == ["items[].note", "ctx"]
    assert "the sinks add them as columns" in taken.lines("evolving")[0]
    assert ledger.reader_schema("evolving") == first.text  # recorded only when an epoch is planned

    renamed = _pipeline({"order_id": "int", "items": [{"sku": "string"}]})
    with pytest.raises(ConfigError) as refused:
        check_reader_schema(renamed, ledger, settings)
    message = str(refused.value)
    assert message.startswith("pipeline 'evolving': the reader schema's change is refused: id (int) is gone")
    assert "order_id (int) is new and required without a default" in message and "\n" not in message


def test_the_reader_row_type_leaves_metadata_out_and_reads_avro_files(tmp_path: Path) -> None:
    avsc = tmp_path / "order.avsc"
    avsc.write_text(
        json.dumps(
            {
                "type": "record",
                "name": "Order",
                "fields": [
                    {"name": "id", "type": "long"},
                    {"name": "tags", "type": {"type": "array", "items": "string"}},
                    {"name": "note", "type": ["null", "string"], "default": None},
                ],
            }
        )
    )
    spec = Pipeline(
        name="avro_evolving",
        source=KafkaSource(topics=("t",)),
        format=AvroFormat(schema_file=str(avsc), wire="plain", key_field="k"),
        sinks=(SinkSpec("out", "files", {"root": "/tmp/unused", "table": "t"}),),
    )
    assert str(reader_row_type(spec).fields) == str(
        (
            ("id", parse_type("int")),
            ("tags", parse_type("array<string>")),
            ("note", parse_type("string?")),
            ("k", parse_type("string")),
        )
    )


def test_the_iceberg_sink_adds_new_fields_at_any_depth_keeping_ids_and_old_rows_still_write(
    tmp_path: Path,
) -> None:
    from pyiceberg import types as T

    from onceflow.committables import TaskContext
    from onceflow.sinks import iceberg
    from onceflow.sinks.iceberg import table as tables

    v1 = {
        "id": "long",
        "order": "struct<sku:string>",
        "items": "array<struct<sku:string>>",
        "attrs": "map<string,struct<n:int?>>",
    }
    config: dict[str, Any] = {
        "name": "lake",
        "table": "web.evolving",
        "catalog": f"test_{tmp_path.name}",
        "catalog_properties": iceberg.default_catalog_properties(tmp_path),
        "columns": v1,
    }

    def spec(columns: dict[str, str]) -> Pipeline:
        sink = {**{k: v for k, v in config.items() if k != "name"}, "columns": columns}
        return Pipeline(
            name="evolving",
            source=KafkaSource(topics=("t",)),
            format=JsonFormat(schema={"id": "int"}),
            sinks=(SinkSpec("lake", "iceberg", sink),),
        )

    def table() -> Any:
        parsed = iceberg.IcebergConfig.from_mapping(config)
        return tables.load(parsed.open_catalog(), parsed.table)

    iceberg.plan_checks(spec(v1), [config], 1)
    before = {f.field_id: f.name for f in table().schema().fields}
    v2 = {
        "id": "long",
        "order": "struct<sku:string,coupon:string?>",
        "items": "array<struct<sku:string,note:string>>",
        "attrs": "map<string,struct<n:int?,m:bool?>>",
        "channel": "string",
    }
    wider = {**config, "columns": v2}
    iceberg.plan_checks(spec(v2), [wider], 1)
    schema = table().schema()
    assert {f.field_id: f.name for f in schema.fields if f.field_id in before} == before
    for name in ("order.coupon", "items.element.note", "attrs.value.m", "channel"):
        assert not schema.find_field(name).required, name
    assert schema.find_field("items.element.note").field_type == T.StringType()
    iceberg.plan_checks(spec(v2), [wider], 1)  # taken once: nothing more to add
    assert table().schema() == schema

    # Rows of the old shape (a replay by the code before) and of the new one both stage.
    for columns, row in (
        (v1, {"id": 1, "order": {"sku": "a"}, "items": [{"sku": "b"}], "attrs": {"x": {"n": 1}}}),
        (
            v2,
            {
                "id": 2,
                "order": {"sku": "a", "coupon": "c"},
                "items": [{"sku": "b", "note": "n"}],
                "attrs": {"x": {"n": 1, "m": True}},
                "channel": "web",
            },
        ),
    ):
        writer = iceberg.IcebergWriter({**config, "columns": columns})
        writer.begin(TaskContext("evolving", 1, 0, f"s0-t{row['id']}", "0", "lake"))
        writer.write([row])
        staged = writer.pre_commit()
        assert staged.record_count == 1


def test_a_column_added_at_the_source_of_avro_change_events_is_taken(tmp_path: Path) -> None:
    """Debezium's envelope gained a nullable `note` in the row record (schema 22 to 23): taken."""
    from onceflow.pipeline import Debezium

    avro = Path(__file__).resolve().parents[1] / "data" / "debezium" / "avro"
    ledger = Ledger.connect(f"sqlite:///{tmp_path / 'ledger.db'}", check=False)
    ledger.upgrade()

    def spec(version: int) -> Pipeline:
        fmt = AvroFormat(schema_file=str(avro / f"schema-{version}.avsc"), changes=Debezium(key=("id",)))
        return Pipeline(
            name="cdc",
            source=KafkaSource(topics=("t",)),
            format=fmt,
            sinks=(SinkSpec("out", "files", {"root": "/tmp/unused", "table": "t"}),),
        )

    first = check_reader_schema(spec(22), ledger, Settings.from_env())
    assert "_op:string" in first.text and "note" not in first.text
    ledger.plan_epoch("cdc", [], [], reader_schema=first.text)
    taken = check_reader_schema(spec(23), ledger, Settings.from_env())
    assert taken.change is not None and taken.change.added == ["note"] and not taken.change.refused

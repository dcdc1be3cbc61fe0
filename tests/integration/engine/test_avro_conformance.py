"""The JVM read path decodes Avro exactly as the Python reader (fastavro) does, on a hostile topic.

One topic holds registry-framed records of three planned writer versions of the subject (the newest is
the reader schema; the oldest lacks fields the reader gives defaults; one lets a required field be
null), of a writer the JVM does not plan (a promoted type, under another subject) and of one the reader
cannot resolve; bad magic bytes, an unknown id, short, truncated and over-long bodies, invalid UTF-8,
out-of-range logical values, bad enum and union indexes, tombstones, oversized and key-less records;
and good records the JVM cannot prove good (a boolean byte 2, a long in a longer varint, a uuid in
capitals) between plainly good ones. Every logical type is there: decimals (bytes and fixed),
timestamp-millis and -micros, dates (before 1582 too) and uuids. Both paths read the same ranges;
the test asserts the same rows, the same dead letters with the same reasons and offsets, that the JVM
turned the plainly good records into rows itself and no record Python rejects, and that each read task's
records come out of its partition in offset order. A plain-wire format is checked the same way. A
version with nested fields the reader does not read is not planned: the JVM path sends its records,
good or cut inside a nested value, to Python wholly.

Nested reader schemas (records in records 30 deep, arrays of records, arrays of arrays, maps, nullable
unions) are read in Python on either path; their test reads a hostile topic in this process and on the
slice's read path (Python workers behind the Spark Connect server, through Arrow): the same rows, the
same dead letters, each reason naming the value at fault by its path (``items[0].qty``,
``grid[1][1]``). Writers retype an array element's field, a map's values, an array's elements and the
deepest value, or let a null into an array or a record inside an array; bodies are cut, padded or
garbled inside nested values; a 10^5-element array is a row.

Writer schemas come from a folder (`FolderSchemaRegistry`, ``file://``): there is no registry server.
The tests run on the Spark Connect server only: a classic session builds the same expressions, and the
JSON conformance test runs the read paths' shared machinery on both.
"""

from __future__ import annotations

import dataclasses
import io
import json
import struct
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from fastavro import parse_schema, schemaless_writer

from onceflow.config import Settings
from onceflow.decoding.schema_registry import FolderSchemaRegistry
from onceflow.engine.jvm_avro import writer_plans
from onceflow.engine.jvm_read import python_read
from onceflow.engine.plan_inspection import physical_plan, plan_leaves, plan_operators
from onceflow.engine.read_path import JVM, PYTHON, decoded_read
from onceflow.executor.slices import SliceRef
from onceflow.pipeline import AvroFormat, KafkaSource, Pipeline, SinkSpec
from tests.integration.engine.conformance import (
    Conformed,
    assert_conforms,
    assert_same_reads,
    in_offset_order,
    read_in_process,
    read_tasks,
    split_collected,
    topic_ranges,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MAX_BYTES = 600
DECIMAL = {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3}
FIXED = {"type": "fixed", "name": "Cents", "size": 8, "logicalType": "decimal", "precision": 18, "scale": 4}
KIND = {"type": "enum", "name": "Kind", "symbols": ["CARD", "CASH", "GIFT"]}
COMMON = [
    {"name": "ok", "type": "boolean"},  # first, so that its byte is the body's first
    {"name": "id", "type": "long"},  # second, so that its varint follows
    {"name": "name", "type": "string"},
    {"name": "amount", "type": DECIMAL},
    {"name": "cents", "type": FIXED},
    {"name": "at_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "kind", "type": KIND},
    {"name": "raw", "type": "bytes"},
    {"name": "ratio", "type": "float"},
    {"name": "score", "type": "double"},
    {"name": "memo", "type": ["null", "string"]},
]
V1 = {"type": "record", "name": "Payment", "fields": COMMON}
# Version 2 (the reader) adds fields with defaults: records of version 1 still read.
ADDED = [
    {"name": "note", "type": "string", "default": "none"},
    {"name": "coupon", "type": ["null", "long"], "default": None},
    {"name": "flag", "type": "boolean", "default": True},
    {"name": "count", "type": "int", "default": 7},
]
V2 = {"type": "record", "name": "Payment", "fields": COMMON + ADDED}
# Version 3 lets score be null, which the reader requires; and drops note (the reader has its default).
V3 = {
    "type": "record",
    "name": "Payment",
    "fields": [
        {**f, "type": ["null", "double"]} if f["name"] == "score" else f
        for f in COMMON + ADDED
        if f["name"] != "note"
    ],
}
# Under another subject: id written as an int (Avro promotes it to long; the JVM leaves that to Python).
PROMOTED = {
    "type": "record",
    "name": "Payment",
    "fields": [{**f, "type": "int"} if f["name"] == "id" else f for f in COMMON + ADDED],
}
TEXT_ID = {"type": "record", "name": "Payment", "fields": [{"name": "id", "type": "string"}]}
# Version 4 adds nested fields the reader does not have: the JVM plans no nested writer schema, so its
# records go to Python wholly, which skips those values (and finds a body cut inside them).
LINE = {
    "type": "record",
    "name": "Line",
    "fields": [{"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}],
}
V4 = {
    "type": "record",
    "name": "Payment",
    "fields": [
        *V2["fields"],
        {"name": "lines", "type": {"type": "array", "items": LINE}},
        {"name": "attrs", "type": {"type": "map", "values": ["null", {"type": "array", "items": "long"}]}},
    ],
}
SCHEMAS = {11: V1, 12: V2, 13: V3, 14: V4, 21: PROMOTED, 22: TEXT_ID}
SUBJECTS = {n: "pay-value" if n < 20 else "other-value" for n in SCHEMAS}


def raw_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with its logical types taken off: records are written from raw ints and bytes, so
    that any value, valid or not, can be written."""

    def strip(t: Any) -> Any:
        if isinstance(t, list):
            return [strip(b) for b in t]
        if isinstance(t, dict) and "logicalType" in t:
            return {k: v for k, v in t.items() if k not in ("logicalType", "precision", "scale")}
        return t

    return {**schema, "fields": [{**f, "type": strip(f["type"])} for f in schema["fields"]]}


def unscaled(n: int) -> bytes:
    """A decimal's unscaled value in its shortest two's complement (what Java writes)."""
    return n.to_bytes(((n if n >= 0 else ~n).bit_length() + 8) // 8, "big", signed=True)


def payment(n: int, **changes: Any) -> dict[str, Any]:
    """A record of version 2 as raw values (see `raw_schema`)."""
    values: dict[str, Any] = {
        "ok": n % 2 == 0,
        "id": n,
        "name": f"payer {n}",
        "amount": unscaled(n * 1001 - 5000),
        "cents": (n * 12345 - 7).to_bytes(8, "big", signed=True),
        "at_ms": 1_764_000_000_000 + n * 1001,
        "at_us": 1_764_000_000_000_000 + n * 1_000_001,
        "day": 20_000 + n,
        "ref": str(uuid.UUID(int=n * 7919 + 1)),
        "kind": KIND["symbols"][n % 3],
        "raw": bytes(range(n % 7)),
        "ratio": n / 8,
        "score": n * 1.25 - 3,
        "memo": None if n % 3 == 0 else f"memo {n}",
        "note": f"note {n}",
        "coupon": None if n % 2 else n * 10,
        "flag": n % 3 == 1,
        "count": n - 50,
    }
    values.update(changes)
    return values


def body(schema_id: int, record: dict[str, Any], **retyped: Any) -> bytes:
    """The record's Avro body in writer schema ``schema_id`` (``retyped``: fields written as another
    type, e.g. an enum's index as an int)."""
    schema = raw_schema(SCHEMAS[schema_id])
    schema = {
        **schema,
        "fields": [{**f, "type": retyped.get(f["name"], f["type"])} for f in schema["fields"]],
    }
    names = {f["name"] for f in schema["fields"]}
    out = io.BytesIO()
    schemaless_writer(out, parse_schema(schema), {k: v for k, v in record.items() if k in names})
    return out.getvalue()


def framed(schema_id: int, record: dict[str, Any], *, wire_id: int | None = None, **retyped: Any) -> bytes:
    header = b"\x00" + struct.pack(">I", schema_id if wire_id is None else wire_id)
    return header + body(schema_id, record, **retyped)


def patched(value: bytes, at: int, old: bytes, new: bytes) -> bytes:
    """``value`` with the bytes ``old`` at ``at`` replaced by ``new``."""
    assert value[at : at + len(old)] == old, value[at : at + len(old)]
    return value[:at] + new + value[at + len(old) :]


# Records the JVM must turn into rows itself.
PLAIN_GOOD: list[bytes] = [
    *(framed(12, payment(n)) for n in range(1, 9)),
    framed(12, payment(9, amount=unscaled(999_999_999_999), cents=(10**18 - 1).to_bytes(8, "big"))),
    framed(
        12,
        payment(10, amount=unscaled(-999_999_999_999), cents=(-(10**18) + 1).to_bytes(8, "big", signed=True)),
    ),
    framed(12, payment(11, amount=unscaled(0), at_ms=-1, at_us=-1, day=-1, ratio=float("inf"))),
    framed(12, payment(12, at_ms=-62_135_596_800_000, at_us=253_402_300_799_999_999, day=-719_162)),
    framed(12, payment(13, day=-200_000, at_ms=-20_000_000_000_000)),  # before 1582: no calendar rebase
    framed(12, payment(14, name="naïve ☃ 😀", memo="", raw=b"", id=-(2**63))),
    framed(12, payment(15, id=2**63 - 1, count=-(2**31), coupon=-(2**63), score=-0.0)),
    framed(12, payment(16, amount=unscaled(127), cents=(128).to_bytes(8, "big"), ratio=1e-45)),
    framed(12, payment(17, amount=unscaled(-128), score=1.7976931348623157e308)),
    *(framed(11, payment(n)) for n in range(20, 24)),  # version 1: the reader's defaults
    *(framed(13, payment(n)) for n in range(30, 33)),  # version 3, score not null
]
# Good records the JVM leaves to Python: it cannot prove them good, or does not plan their writer.
DOUBTFUL_GOOD: list[bytes] = [
    patched(framed(12, payment(40, ok=True)), 5, b"\x01", b"\x02"),  # fastavro reads true, Java false
    patched(framed(12, payment(41, id=1)), 6, b"\x02", b"\x82\x00"),  # id 1 in a two-byte varint
    framed(12, payment(42, ref=str(uuid.UUID(int=42)).upper())),
    framed(12, payment(43, ref="{" + str(uuid.UUID(int=43)) + "}")),
    framed(12, payment(46, amount=b"\x00\x05")),  # a decimal in a longer two's complement than Java's
    framed(21, payment(44)),  # a promoted type: not planned
    framed(21, payment(45)),
    framed(14, payment(47, lines=[{"sku": "a", "qty": 1}] * 3, attrs={"x": [1, 2], "y": None})),  # nested
    framed(14, payment(48, lines=[], attrs={})),
]
# A version 4 record whose nested values are the body's last bytes: the line and the map, then the end.
NESTED_TAIL = framed(14, payment(75, lines=[{"sku": "abc", "qty": 1}], attrs={}))
assert NESTED_TAIL.endswith(b"\x02\x06abc\x02\x00\x00")
BAD: list[bytes] = [
    b"\x01" + framed(12, payment(50))[1:],  # bad magic byte
    b"",
    b"\x00\x00\x00",  # shorter than the header
    framed(12, payment(51), wire_id=99),  # an id the registry does not have
    framed(12, payment(52))[:40],  # truncated
    framed(12, payment(53)) + b"\x00",  # a byte after the record
    framed(12, payment(54)) + b"\x02\x41",
    patched(framed(12, payment(55, id=1, name="xx")), 8, b"xx", b"\xc3\x28"),  # not UTF-8
    patched(framed(12, payment(56, id=1, name="xxx")), 8, b"xxx", b"\xed\xa0\x80"),  # a surrogate
    framed(12, payment(57, ref="not-a-uuid")),
    framed(12, payment(68, amount=unscaled(10**12))),  # 13 digits in a decimal(12, 3)
    framed(12, payment(69, cents=(10**18).to_bytes(8, "big"))),  # 19 digits in a decimal(18, 4)
    framed(12, payment(58, at_ms=2**62)),  # beyond Python's datetime, and Spark's microseconds
    framed(12, payment(59, at_us=253_402_300_800_000_000)),  # the year 10000
    framed(12, payment(60, at_ms=-62_135_596_800_001)),  # before the year 1
    framed(12, payment(61, day=2_932_897)),
    framed(12, payment(62, day=-719_163)),
    framed(12, payment(63, kind=5), kind="int"),  # an enum index beyond its symbols
    framed(12, payment(64, memo=7), memo=["null", "string", "int"]),  # a union index beyond it
    framed(13, payment(65, score=None)),  # null where the reader requires a value
    framed(13, payment(66, score=None, flag=False)),
    framed(22, {"id": "text"}),  # a writer the reader cannot resolve
    framed(12, payment(67, memo="m" * MAX_BYTES)),  # oversized
    NESTED_TAIL[:-4],  # cut inside a nested record, in a field the reader does not read
    # a line count in ten bytes
    NESTED_TAIL[:-8] + b"\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x01" + NESTED_TAIL[-7:],
    NESTED_TAIL[:-7] + b"\x7f" + NESTED_TAIL[-6:],  # a nested string of length -64
]


def _schema_folder(
    folder: Path, schemas: dict[int, Any] = SCHEMAS, subjects: dict[int, str] = SUBJECTS
) -> str:
    folder.mkdir()
    entries = []
    for schema_id, schema in schemas.items():
        (folder / f"v{schema_id}.avsc").write_text(json.dumps(schema))
        version = schema_id % 10
        entries.append(
            {
                "id": schema_id,
                "subject": subjects[schema_id],
                "version": version,
                "file": f"v{schema_id}.avsc",
            }
        )
    (folder / "registry.json").write_text(json.dumps({"schemas": entries}))
    return f"file://{folder}"


def _produce(bootstrap: str, topic: str, values: list[bytes], keyed: bool = True) -> None:
    """Good, doubtful and bad records mixed in each partition, in a committed and an aborted
    transaction; then key-less, tombstone and non-UTF-8 key records from a plain producer."""
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": uuid.uuid4().hex})
    txn.init_transactions(30)
    for batch, commit in ((values, True), (values[:7], False)):
        txn.begin_transaction()
        for n, value in enumerate(batch):
            txn.produce(topic, key=f"k{n}".encode(), value=value, partition=n % 2)
        if commit:
            txn.commit_transaction(30)
        else:
            txn.flush(30)
            txn.abort_transaction(30)
    if not keyed:
        return
    plain = Producer({"bootstrap.servers": bootstrap})
    plain.produce(topic, key=None, value=framed(12, payment(70)), partition=0)  # the format needs a key
    plain.produce(topic, key=b"\xff\xfe", value=framed(12, payment(71)), partition=1)  # not UTF-8
    plain.produce(topic, key=b"tomb", value=None, partition=0)
    plain.produce(topic, key=b"", value=framed(12, payment(72)), partition=1)  # an empty key is a key
    plain.flush(30)


def _pipeline(topic: str, fmt: AvroFormat, tmp: Path) -> Pipeline:
    return Pipeline(
        name=f"avro-conformance-{uuid.uuid4().hex[:8]}",
        source=KafkaSource(topics=(topic,)),
        format=fmt,
        sinks=(SinkSpec("unused", "files", {"root": str(tmp), "table": "unused"}),),
        max_records_per_task=9,
        max_record_bytes=MAX_BYTES,
    )


def _collected(frame: Any) -> list[Any]:
    """The frame's rows, timestamps as microseconds and dates as days since the epoch: exactly what
    Spark holds, whatever the client's time zone and Python's datetime range."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    def exact(field: Any) -> Any:
        if isinstance(field.dataType, T.TimestampType):
            return F.unix_micros(field.name).alias(field.name)
        if isinstance(field.dataType, T.DateType):
            return F.unix_date(field.name).alias(field.name)
        return F.col(field.name)

    return frame.select(*(exact(f) for f in frame.schema.fields)).collect()


def _both_paths(spark: Any, ref: SliceRef, tasks: list[Any]) -> Conformed:
    """Python's rows and dead letters (the Python read path, through Spark like a slice's) against the
    JVM path's with the writer schemas the driver plans (`assert_conforms`)."""
    python = split_collected(_collected(python_read(spark, ref, tasks)))
    registry = FolderSchemaRegistry(ref.task.schema_registry_url.removeprefix("file://"))
    plans, _ = writer_plans(ref.pipeline.format, registry, [ref.slice_ranges[0].topic])
    return assert_conforms(spark, ref, tasks, python, plans=plans, collect=_collected)


def test_the_jvm_path_decodes_avro_as_the_python_reader_does(
    settings: Settings, make_topic: Any, connect_spark: Any, tmp_path: Path
) -> None:
    spark = connect_spark
    topic = make_topic("avro-conformance", partitions=2)
    values = [v for trio in zip(PLAIN_GOOD, DOUBTFUL_GOOD * 5, BAD * 2, strict=False) for v in trio]
    values += PLAIN_GOOD[len(values) // 3 :] + DOUBTFUL_GOOD + BAD
    values = list(dict.fromkeys(values))  # each value once, doubtful and bad ones among the good
    assert set(values) == set(PLAIN_GOOD + DOUBTFUL_GOOD + BAD)
    _produce(settings.kafka_bootstrap, topic, values)
    ranges = topic_ranges(settings.kafka_bootstrap, topic)
    spec = _pipeline(topic, AvroFormat(subject="pay-value", key_field="key").pin(json.dumps(V2)), tmp_path)
    local = dataclasses.replace(settings, schema_registry_url=_schema_folder(tmp_path / "schemas"))
    ref = SliceRef(spec, 1, 0, tuple(ranges), settings.kafka_bootstrap, settings=local)
    tasks = read_tasks(spec, ranges)

    conformed = _both_paths(spark, ref, tasks)
    rows, dead, got, accepted = conformed.rows, conformed.dead, conformed.got, conformed.accepted
    assert len(rows) + len(dead) == len(values) + 4  # the aborted records and the markers are skipped
    codes = {d.code for d in dead}
    assert codes == {
        "bad_magic_byte",
        "malformed_avro",
        "unknown_schema_id",
        "null_field",
        "incompatible_schema",
        "oversized",
        "missing_key",
        "not_utf8",
        "null_value",
    }
    assert len(dead) == len(BAD) + 3
    # The JVM accepted the plainly good records itself (and the empty key's), none that Python rejects.
    assert not accepted & {(d.partition, d.offset) for d in dead}
    assert len(accepted) == len(PLAIN_GOOD) + 1, sorted(accepted)
    assert len(rows) == len(PLAIN_GOOD) + len(DOUBTFUL_GOOD) + 1

    # What a slice does: the JVM path, with the subject's three planned versions.
    read = decoded_read(spark, ref, tasks)
    assert (read.path, read.reason) == (JVM, "Spark's Kafka source and from_avro (3 writer schemas)")
    assert read.leaves == len(tasks) == len(plan_leaves(plan_operators(physical_plan(read.frame))))
    assert [tuple(r) for r in _collected(read.frame)] == [tuple(r) for r in got]


def test_plain_avro_bodies_decode_alike_with_the_one_writer_schema(
    settings: Settings, make_topic: Any, connect_spark: Any, tmp_path: Path
) -> None:
    spark = connect_spark
    topic = make_topic("avro-plain", partitions=2)
    good = [body(11, payment(n)) for n in range(1, 12)]
    doubtful = [patched(body(11, payment(20, ok=True)), 0, b"\x01", b"\x02")]
    bad = [b"", body(11, payment(30))[:25], body(11, payment(31)) + b"\x00", body(12, payment(32))]
    values = [v for pair in zip(good, doubtful + bad + good, strict=False) for v in pair]
    values = list(dict.fromkeys(values))
    _produce(settings.kafka_bootstrap, topic, values, keyed=False)
    reader, writer = tmp_path / "reader.avsc", tmp_path / "writer.avsc"
    reader.write_text(json.dumps(V2))
    writer.write_text(json.dumps(V1))
    fmt = AvroFormat(schema_file=str(reader), wire="plain", writer_schema_file=str(writer))
    spec = _pipeline(topic, fmt, tmp_path)
    ranges = topic_ranges(settings.kafka_bootstrap, topic)
    local = dataclasses.replace(settings, schema_registry_url=_schema_folder(tmp_path / "schemas"))
    ref = SliceRef(spec, 1, 0, tuple(ranges), settings.kafka_bootstrap, settings=local)
    conformed = _both_paths(spark, ref, read_tasks(spec, ranges))
    rows, dead, accepted = conformed.rows, conformed.dead, conformed.accepted
    assert {d.code for d in dead} == {"malformed_avro"} and len(dead) == len(bad)
    assert len(rows) == len(good) + len(doubtful)
    assert len(accepted) == len(good)


# ------------------------------------------------------------------------------------ nested records


def _deep(levels: int, leaf: str) -> dict[str, Any]:
    """``levels`` records, each the only field ``d`` of the one around it, ``leaf`` innermost."""
    t: Any = leaf
    for level in range(levels):
        t = {"type": "record", "name": f"Level{level}", "fields": [{"name": "d", "type": t}]}
    return t


def _order_schema(
    qty: Any = "int", tags: Any = "string", counts: Any = "int", cell: Any = "int", leaf: str = "long"
) -> dict[str, Any]:
    """An order: items in an array of records, a nullable context with an array, a map of counters, an
    array of arrays and a value 30 records deep; the arguments retype one nested place each."""
    item = {
        "type": "record",
        "name": "Item",
        "fields": [
            {"name": "sku", "type": "string"},
            {"name": "qty", "type": qty},
            {"name": "price", "type": ["null", "double"], "default": None},
        ],
    }
    ctx = {
        "type": "record",
        "name": "Ctx",
        "fields": [
            {"name": "ip", "type": ["null", "string"]},
            {"name": "tags", "type": {"type": "array", "items": tags}},
        ],
    }
    return {
        "type": "record",
        "name": "Order",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "items", "type": {"type": "array", "items": item}},
            {"name": "ctx", "type": ["null", ctx], "default": None},
            {"name": "counts", "type": {"type": "map", "values": counts}},
            {"name": "grid", "type": {"type": "array", "items": {"type": "array", "items": cell}}},
            {"name": "deep", "type": _deep(30, leaf)},
        ],
    }


ORDER = _order_schema()  # the reader, and writer 41
ORDER_SCHEMAS = {
    41: ORDER,
    42: _order_schema(cell=["null", "int"]),  # a null may sit in the grid, which the reader refuses
    43: _order_schema(qty="string"),  # items' qty a string: an array element's field of another type
    44: _order_schema(counts="string"),  # a map's values of another type
    45: _order_schema(leaf="string"),  # the deepest value of another type
    46: _order_schema(qty=["null", "int"]),  # a null may sit in an item's qty
    47: _order_schema(tags="int"),  # an array's elements of another type
}
ORDER_SUBJECTS = dict.fromkeys(ORDER_SCHEMAS, "order-value")
ORDER_BYTES = 2_000_000


def _level(levels: int, leaf: Any) -> Any:
    return leaf if levels == 0 else {"d": _level(levels - 1, leaf)}


def order(n: int, **changes: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "id": n,
        "items": [{"sku": f"s{n}-{i}", "qty": i + 1, "price": i / 4 if i else None} for i in range(4)],
        "ctx": {"ip": "10.0.0.1", "tags": ["a", "b"]},
        "counts": {"seen": n, "kept": 1},
        "grid": [[1, 2], [], [n]],
        "deep": _level(30, n),
    }
    values.update(changes)
    return values


def order_framed(schema_id: int, values: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, parse_schema(ORDER_SCHEMAS[schema_id]), values)
    return b"\x00" + struct.pack(">I", schema_id) + out.getvalue()


def _item(qty: Any = 1) -> dict[str, Any]:
    return {"sku": "x", "qty": qty, "price": None}


# A record whose items are the body's bytes after the id: count 2, then "x", qty 1, no price, end.
SHORT = order_framed(41, order(90, items=[_item()]))
assert SHORT[5:12] == b"\xb4\x01\x02\x02x\x02\x00", SHORT[5:12]
ORDER_GOOD: list[bytes] = [
    order_framed(41, order(1)),
    order_framed(41, order(2, ctx=None, items=[], counts={}, grid=[])),
    order_framed(41, order(3, ctx={"ip": None, "tags": []}, counts={"a b": -1, "": 0, "naïve ☃": 2})),
    order_framed(41, order(4, grid=[list(range(100_000))])),  # a 10^5-element array
    order_framed(41, order(5, items=[_item(qty=-(2**31))] * 50, deep=_level(30, -(2**63)))),
    order_framed(42, order(6, grid=[[1], [2, 3]])),  # a nullable writer without a null resolves
    order_framed(43, order(7, items=[])),  # items' qty is never read: resolution is per value
    order_framed(46, order(8, items=[_item(qty=5)] * 4)),
    order_framed(47, order(9, ctx=None)),  # no tags to read
]
ORDER_BAD: dict[bytes, str] = {
    order_framed(42, order(20, grid=[[1], [2, None]])): "null_field: field 'grid[1][1]' is null",
    order_framed(43, order(21, items=[_item(qty="1")])): "at field 'items[0].qty'",
    order_framed(44, order(22, counts={"ok": "1"})): "at field 'counts'",
    order_framed(44, order(23, counts={})): "at field 'counts'",  # the map's type itself does not resolve
    order_framed(45, order(24, deep=_level(30, "x"))): "at field 'deep" + ".d" * 30 + "'",
    order_framed(
        46, order(25, items=[_item(), _item(), _item(), _item(qty=None)])
    ): "field 'items[3].qty' is null",
    order_framed(47, order(26, ctx={"ip": "x", "tags": [1, 2]})): "at field 'ctx.tags'",
    order_framed(41, order(27))[:-3]: "malformed_avro",  # cut inside the deepest value... or the grid
    SHORT[:9]: "malformed_avro",  # cut inside an item
    # an item count in ten bytes
    SHORT[:7] + b"\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x01" + SHORT[8:]: "malformed_avro",
    SHORT[:8] + b"\x7f" + SHORT[9:]: "malformed_avro",  # a nested string of length -64
    SHORT[:11] + b"\x04" + SHORT[12:]: "malformed_avro",  # a union index beyond the price's union
    SHORT + b"\x00": "malformed_avro: writer schema id 41: 1 bytes left after the record",
}


def test_nested_avro_reads_alike_in_the_task_and_on_the_slices_read_path(
    settings: Settings, make_topic: Any, connect_spark: Any, tmp_path: Path
) -> None:
    """Nested writer schemas are not planned in the JVM: the slice's read decodes them in Python's
    workers, through Arrow, and gives the rows and dead letters the decoder gives in this process,
    each dead letter naming the value at fault by its path."""
    topic = make_topic("avro-nested", partitions=2, **{"max.message.bytes": str(ORDER_BYTES)})
    values = [v for pair in zip(ORDER_GOOD, ORDER_BAD, strict=False) for v in pair]
    values += ORDER_GOOD[len(values) // 2 :] + list(ORDER_BAD)[len(values) // 2 :]
    assert sorted(values) == sorted(ORDER_GOOD + list(ORDER_BAD))
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "message.max.bytes": ORDER_BYTES})
    for n, value in enumerate(values):
        producer.produce(topic, key=f"k{n}".encode(), value=value, partition=n % 2)
    producer.flush(30)
    folder = _schema_folder(tmp_path / "schemas", ORDER_SCHEMAS, ORDER_SUBJECTS)
    fmt = AvroFormat(subject="order-value", key_field="key").pin(json.dumps(ORDER))
    spec = dataclasses.replace(_pipeline(topic, fmt, tmp_path), max_record_bytes=ORDER_BYTES)
    ranges = topic_ranges(settings.kafka_bootstrap, topic)
    local = dataclasses.replace(settings, schema_registry_url=folder)
    ref = SliceRef(spec, 1, 0, tuple(ranges), settings.kafka_bootstrap, settings=local)
    tasks = read_tasks(spec, ranges)

    rows, dead = read_in_process(ref, tasks)
    assert len(rows) + len(dead) == len(values)
    read = decoded_read(connect_spark, ref, tasks)
    assert read.path == PYTHON
    assert "nested types are decoded in Python" in read.reason, read.reason
    got = read.frame.collect()
    assert in_offset_order(got, len(rows[0]) - 2) == []
    assert_same_reads(rows, dead, *split_collected(got))

    assert sorted(r[0] for r in rows) == list(range(1, 10))
    reasons = {d.value: d.reason for d in dead}
    assert len(reasons) == len(ORDER_BAD)
    for value, expected in ORDER_BAD.items():
        assert expected in reasons[value], reasons[value]
    (grid,) = [r[4] for r in rows if r[0] == 4]
    assert grid == [list(range(100_000))]
    (deep,) = [r[5] for r in rows if r[0] == 5]
    for _ in range(29):
        deep = deep["d"]
    assert deep == {"d": -(2**63)}

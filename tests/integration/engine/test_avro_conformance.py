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
records come out of its partition in offset order. A plain-wire format is checked the same way.

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
from onceflow.decoding.records import DeadLetter
from onceflow.decoding.schema_registry import FolderSchemaRegistry
from onceflow.engine.jvm_avro import writer_plans
from onceflow.engine.jvm_checks import kafka_source_missing
from onceflow.engine.jvm_read import DEAD_LETTER_COLUMN, jvm_read, python_read, task_kafka_frame
from onceflow.engine.plan_inspection import physical_plan, plan_leaves, plan_operators
from onceflow.engine.read_path import JVM, decoded_read
from onceflow.executor.slices import SliceRef
from onceflow.pipeline import AvroFormat, KafkaSource, Pipeline, SinkSpec
from tests.integration.engine.test_jvm_conformance import _in_offset_order, _key, _ranges, _tasks

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
SCHEMAS = {11: V1, 12: V2, 13: V3, 21: PROMOTED, 22: TEXT_ID}
SUBJECTS = {11: "pay-value", 12: "pay-value", 13: "pay-value", 21: "other-value", 22: "other-value"}


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
]
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
]


def _schema_folder(folder: Path) -> str:
    folder.mkdir()
    entries = []
    for schema_id, schema in SCHEMAS.items():
        (folder / f"v{schema_id}.avsc").write_text(json.dumps(schema))
        version = schema_id % 10
        entries.append(
            {
                "id": schema_id,
                "subject": SUBJECTS[schema_id],
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


def _both_paths(spark: Any, ref: SliceRef, tasks: list[Any]) -> tuple[Any, ...]:
    """Python's rows and dead letters (the Python read path, through Spark like a slice's), the
    JVM's, the JVM's records in read order, and which records the JVM accepted itself."""
    python = _collected(python_read(spark, ref, tasks))
    registry = FolderSchemaRegistry(ref.settings.schema_registry_url.removeprefix("file://"))
    plans, _ = writer_plans(ref.pipeline.format, registry, [ref.slice_ranges[0].topic])
    kafka, missing = kafka_source_missing(lambda: task_kafka_frame(spark, ref.bootstrap, tasks))
    assert missing is None
    frame, checked = jvm_read(kafka, ref, plans)
    got = _collected(frame)
    accepted = {
        (r["partition"], r["offset"])
        for r in checked.where("_accepted").select("partition", "offset").collect()
    }

    def split_rows(collected: list[Any]) -> tuple[list[Any], list[DeadLetter]]:
        return (
            [tuple(r)[:-1] for r in collected if r[DEAD_LETTER_COLUMN] is None],
            [
                DeadLetter.from_json(r[DEAD_LETTER_COLUMN])
                for r in collected
                if r[DEAD_LETTER_COLUMN] is not None
            ],
        )

    return (*split_rows(python), *split_rows(got), got, accepted)


def _same(rows: list[Any], dead: list[DeadLetter], jvm_rows: list[Any], jvm_dead: list[DeadLetter]) -> None:
    offset_at = len(rows[0]) - 2

    def order(r: tuple[Any, ...]) -> tuple[Any, ...]:
        return (r[offset_at - 1], r[offset_at])

    assert sorted(jvm_rows, key=order) == sorted(rows, key=order)
    assert sorted(map(_key, jvm_dead)) == sorted(map(_key, dead))


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
    ranges = _ranges(settings.kafka_bootstrap, topic)
    spec = _pipeline(topic, AvroFormat(subject="pay-value", key_field="key").pin(json.dumps(V2)), tmp_path)
    local = dataclasses.replace(settings, schema_registry_url=_schema_folder(tmp_path / "schemas"))
    ref = SliceRef(spec, 1, 0, tuple(ranges), settings.kafka_bootstrap, settings=local)
    tasks = _tasks(spec, ranges)

    rows, dead, jvm_rows, jvm_dead, got, accepted = _both_paths(spark, ref, tasks)
    assert len(rows) + len(dead) == len(values) + 4  # the aborted records and the markers are skipped
    _same(rows, dead, jvm_rows, jvm_dead)
    offset_at = len(rows[0]) - 2
    assert _in_offset_order(got, offset_at) == []
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
    ranges = _ranges(settings.kafka_bootstrap, topic)
    local = dataclasses.replace(settings, schema_registry_url=_schema_folder(tmp_path / "schemas"))
    ref = SliceRef(spec, 1, 0, tuple(ranges), settings.kafka_bootstrap, settings=local)
    rows, dead, jvm_rows, jvm_dead, got, accepted = _both_paths(spark, ref, _tasks(spec, ranges))
    _same(rows, dead, jvm_rows, jvm_dead)
    assert _in_offset_order(got, len(rows[0]) - 2) == []
    assert {d.code for d in dead} == {"malformed_avro"} and len(dead) == len(bad)
    assert len(rows) == len(good) + len(doubtful)
    assert len(accepted) == len(good)

"""The JVM read path decodes exactly as the Python reader does, on a hostile topic.

One topic holds committed and aborted transactions (so control markers and invisible records sit
between the committed ones), malformed and non-UTF-8 values, missing, null and wrong-typed fields,
oversized, key-less and null-value records, and good records of every field type in many spellings.
Today's Python reader and decoder (`read_task`) and the JVM path (`jvm_read`, through the warm Spark
Connect server and through a classic local session with Spark's Kafka source on its classpath, as a
spark-submit driver has it) read the same ranges; the test asserts the same rows, the same dead letters
with the same reasons and offsets, that the JVM did turn the plainly good records into rows itself, and
that each read task's records, rows and dead letters alike, come out of its own partition in offset
order.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from typing import Any

import pytest
from bench.one_parse import variant_checks
from confluent_kafka import Producer

from onceflow.engine.plan_inspection import physical_plan, plan_leaves, plan_operators
from onceflow.engine.read_path import JVM, PYTHON, decoded_read
from onceflow.executor.slices import SliceRef
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec
from tests.integration.engine.conformance import (
    Conformed,
    assert_conforms,
    read_in_process,
    read_tasks,
    topic_ranges,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MAX_BYTES = 400
SCHEMA = {
    "s": "string",
    "i": "int",
    "f": "float",
    "b": "bool",
    "os": "string?",
    "oi": "int?",
    "of": "float?",
    "ob": "bool?",
}


def good(n: int, **changes: Any) -> dict[str, Any]:
    record: dict[str, Any] = {"s": f"s{n}", "i": n, "f": n / 4, "b": n % 2 == 0, "os": "o", "oi": -n}
    record.update({"of": 1.5, "ob": False})
    record.update(changes)
    return record


def enc(document: Any, **dumps: Any) -> bytes:
    return json.dumps(document, **dumps).encode()


# Records the JVM must turn into rows itself: plain JSON objects, every field type, optional fields
# absent or null, extra and nested fields, floats written as integers, 64-bit limits, whitespace.
PLAIN_GOOD: list[bytes] = [
    enc(good(1)),
    enc(good(2), separators=(",", ":")),
    enc({k: v for k, v in good(3).items() if not k.startswith("o")}),
    enc(good(4, os=None, oi=None, of=None, ob=None)),
    enc(good(5, f=7, of=-0)),
    enc(good(6, i=2**63 - 1, oi=-(2**63))),
    enc(good(7, f=-0.0, s="")),
    enc(good(8, extra={"deep": [1, {"x": None}]}, more=[True, 1.5e300])),
    enc(good(9, s="naïve ☃ 😀"), ensure_ascii=False),
    enc(good(10, s="café"), ensure_ascii=True),
    b"  \n" + enc(good(11)) + b" \r\n\t",
    enc(good(12, f=1e-400, of=123456789012345678901234567890)),
    enc(good(13, f=0.1, of=2.5e-308, s='quote " and \\ backslash /')),
    b'{"s":"x","i":1,"f":2.5,"b":true,"i":3}',  # duplicate key: the last one counts
    b'{"s":"x","i":1,"f":2.5,"b":true,"S":"case","OI":5}',  # names are case-sensitive
    enc(good(16, f=1.7976931348623157e308, of=5e-324)),
]
# Good records that Python accepts but the JVM sends to Python (it cannot prove them good).
DOUBTFUL_GOOD: list[bytes] = [
    enc(good(20, s="😀"), ensure_ascii=True),  # an escaped surrogate pair
    enc(good(21, note="\ud800")),  # a lone surrogate, in a field the schema does not have
    b'{"s":"x","i":1,"f":1e400,"b":true}',  # Python's float overflows to infinity
    b'{"s":"x","i":1,"f":2,"b":true,"x":"\\u0001"}',  # the JVM check's reserved escape
]
BAD: list[bytes] = [
    b"{not json",
    b"",
    b'{"s":"x","i":1,"f":2,"b":true} trailing',
    b'{"s":"x","i":1,"f":2,"b":true}{"s":"y"}',
    b'{"s":"x","i":1,"f":2,"b":true}}',
    b'{"s":"x","i":1,"f":2,"b":true}, {"\\u0001":1}] z',
    b'{"s":"x","i":1,"f":2,"b":true}, 5]',
    b'[{"s":"x","i":1,"f":2,"b":true}]',
    b"42",
    b'"text"',
    b"null",
    b"\xef\xbb\xbf" + enc(good(30)),  # a UTF-8 byte order mark
    b"\xff\xfe\x00",
    b'{"s":"\xc3\x28","i":1,"f":2,"b":true}',  # invalid UTF-8 inside a string
    b'{"s":"\xed\xa0\x80","i":1,"f":2,"b":true}',  # an encoded surrogate
    b"{'s':'x','i':1,'f':2,'b':true}",
    b'{"s":"x","i":1,"f":NaN,"b":true}',
    b'{"s":"x","i":1,"f":"NaN","b":true}',
    b'{"s":"x","i":1,"f":Infinity,"b":true}',
    b'{"s":"x","i":01,"f":2,"b":true}',
    b'{"s":"x","i":1,"f":2,"b":true,}',
    b'{"s":"x","i":1,"f":2,"b":true /* c */}',
    b'{"s":"tab\there","i":1,"f":2,"b":true}',
    b'{"s":"x","i":1,"f":.5,"b":true}',
    enc({k: v for k, v in good(31).items() if k != "i"}),  # missing required field
    enc(good(32, s=None)),
    enc(good(33, i="1")),
    enc(good(34, i=1.0)),
    enc(good(35, i=True)),
    enc(good(36, i=2**63)),
    enc(good(37, i=-(2**63) - 1)),
    b'{"s":"x","i":1e2,"f":2,"b":true}',
    enc(good(38, f="2.5")),
    enc(good(39, f=False)),
    enc(good(40, b=1)),
    enc(good(41, b="true")),
    enc(good(42, s=5)),
    enc(good(43, s={"nested": "object"})),
    enc(good(44, s=["array"])),
    enc(good(45, s=True)),
    enc(good(46, oi="7")),
    enc(good(47, os=5)),
    enc(good(48, of="x")),
    enc(good(49, ob=0)),
    b'{"s":"x","i":1,"f":2,"b":true,"os":{"a":1,"a":2}}',
    b'{"s":"x","i":"y","i":1,"f":2,"b":true}',  # duplicate key: Python keeps the last, good one
    b'{"s":"x","i":1,"i":"y","f":2,"b":true}',
    enc(good(51, s="x" * MAX_BYTES)),  # oversized
]


def _produce(bootstrap: str, topic: str) -> None:
    """Committed transactions around an aborted one, then records from a plain producer."""
    values = PLAIN_GOOD + DOUBTFUL_GOOD + BAD
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": uuid.uuid4().hex})
    txn.init_transactions(30)
    half = len(values) // 2
    for batch, commit in ((values[:half], True), (values[:10], False), (values[half:], True)):
        txn.begin_transaction()
        for n, value in enumerate(batch):
            txn.produce(topic, key=f"k{n}".encode(), value=value, partition=n % 2)
        if commit:
            txn.commit_transaction(30)
        else:
            txn.flush(30)
            txn.abort_transaction(30)
    plain = Producer({"bootstrap.servers": bootstrap})
    plain.produce(topic, key=None, value=enc(good(60)), partition=0)  # key-less: the format needs one
    plain.produce(topic, key=b"\xff\xfe", value=enc(good(61)), partition=1)  # a key that is not UTF-8
    plain.produce(topic, key=b"tomb", value=None, partition=0)  # a tombstone
    plain.produce(topic, key=b"", value=enc(good(62)), partition=1)  # an empty key is a key
    plain.produce(topic, key=b"h", value=enc(good(63)), partition=0, headers=[("h", b"v"), ("n", None)])
    plain.produce(topic, key=b"t", value=enc(good(64)), partition=1, timestamp=1_234_567)
    plain.flush(30)
    txn.begin_transaction()
    txn.produce(topic, key=b"last", value=enc(good(65)), partition=0)
    txn.commit_transaction(30)


# Every field type with the record key as a column; and numbers only (no string field, no key).
FORMATS = {
    "all_types": JsonFormat(schema=SCHEMA, key_field="k"),
    "numbers": JsonFormat(schema={"i": "int", "f": "float", "oi": "int?", "ob": "bool?"}),
}


def _pipeline(topic: str, tmp: str, fmt: JsonFormat = FORMATS["all_types"]) -> Pipeline:
    return Pipeline(
        name=f"conformance-{uuid.uuid4().hex[:8]}",
        source=KafkaSource(topics=(topic,)),
        format=fmt,
        sinks=(SinkSpec("unused", "files", {"root": tmp, "table": "unused"}),),
        max_records_per_task=9,
        max_record_bytes=MAX_BYTES,
    )


def _conforms(
    settings: Any, make_topic: Any, spark: Any, tmp: str, fmt: JsonFormat, json_checks: Any = None
) -> Conformed:
    """Reads the hostile topic both ways and asserts the same rows and dead letters (`assert_conforms`)."""
    topic = make_topic("conformance", partitions=2)
    _produce(settings.kafka_bootstrap, topic)
    ranges = topic_ranges(settings.kafka_bootstrap, topic)
    spec = _pipeline(topic, tmp, fmt)
    ref = SliceRef(spec, 1, 0, tuple(ranges), settings.kafka_bootstrap, settings=settings)
    tasks = read_tasks(spec, ranges)
    rows, dead = read_in_process(ref, tasks)
    read = len(rows) + len(dead)
    committed = len(PLAIN_GOOD + DOUBTFUL_GOOD + BAD) + 6 + 1
    assert read == committed  # the aborted records and the markers are skipped, nothing else
    assert sum(r.span for r in ranges) > read
    return assert_conforms(spark, ref, tasks, (rows, dead), json_checks=json_checks)


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS.keys())
def test_the_jvm_path_gives_the_python_readers_rows_and_dead_letters(
    settings, make_topic, spark, tmp_path, fmt
) -> None:
    conformed = _conforms(settings, make_topic, spark, str(tmp_path), fmt)
    accepted, rows, dead = conformed.accepted, conformed.rows, conformed.dead
    codes = {d.code for d in dead}
    assert codes >= {"oversized", "null_value", "not_utf8", "malformed_json", "not_object", "wrong_type"}
    if fmt.key_field is None:
        assert "missing_key" not in codes and len(accepted) > len(PLAIN_GOOD)
        return
    assert codes >= {"missing_field", "missing_key"}
    # The JVM accepted the plainly good records itself, and only those.
    plain_good = len(PLAIN_GOOD) + 4  # and four of the plain producer's: a header, a timestamp, ...
    assert len(accepted) == plain_good, sorted(accepted)
    assert len(rows) == plain_good + len(DOUBTFUL_GOOD) + 1  # + the duplicate key Python keeps


def test_the_one_parse_criterion_that_bench_one_parse_times_is_exact_too(
    settings, make_topic, spark, tmp_path
) -> None:
    """`bench.one_parse` times a single Variant parse against the two parses: the same rows and dead
    letters here make that a comparison of two correct criteria. It leaves two plainly good records to
    Python: a duplicate key fails its parse, and "-0.0" is a decimal zero without its sign."""
    fmt = FORMATS["all_types"]
    accepted = _conforms(settings, make_topic, spark, str(tmp_path), fmt, variant_checks).accepted
    assert len(accepted) == len(PLAIN_GOOD) + 4 - 2


def test_the_settings_choose_the_json_path_and_a_fault_plan_keeps_the_python_reader(
    settings, make_topic, spark, tmp_path, monkeypatch
) -> None:
    topic = make_topic("conformance", partitions=2)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    for n in range(6):
        producer.produce(topic, key=f"k{n}".encode(), value=enc(good(n)), partition=n % 2)
    producer.flush(30)
    ranges = topic_ranges(settings.kafka_bootstrap, topic)
    spec = _pipeline(topic, str(tmp_path))
    tasks = read_tasks(spec, ranges)

    def ref_reading(json_read: str) -> SliceRef:
        chosen = replace(settings, json_read=json_read)
        return SliceRef(spec, 1, 0, tuple(ranges), settings.kafka_bootstrap, settings=chosen)

    read = decoded_read(spark, ref_reading("python"), tasks)
    assert (read.path, read.reason) == (PYTHON, "ONCEFLOW_JSON_READ=python, the default")
    python = [tuple(r) for r in read.frame.collect()]
    ref = ref_reading("jvm")
    read = decoded_read(spark, ref, tasks)
    assert read.path == JVM
    assert read.leaves == len(tasks) == len(plan_leaves(plan_operators(physical_plan(read.frame))))
    warm = [tuple(r) for r in read.frame.collect()]
    assert warm == python
    # Armed in this (the driver's) process only: the server's Python workers never crash here.
    monkeypatch.setenv("ONCEFLOW_CRASH_AT", "task_mid_read")
    read = decoded_read(spark, ref, tasks)
    assert read.path == PYTHON and read.reason == "a fault plan is armed"
    assert read.leaves == 1 == len(plan_leaves(plan_operators(physical_plan(read.frame))))
    assert [tuple(r) for r in read.frame.collect()] == warm  # the same records, in the same order
    assert len(warm) == 6

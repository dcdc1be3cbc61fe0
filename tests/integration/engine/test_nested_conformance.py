"""Nested JSON: the JVM read path decodes exactly as the Python reader does, on a hostile topic.

The schema nests structs, arrays and maps (an order with its items, a nullable context object, a map of
counters, an array of arrays). The topic holds plainly good records, which the JVM must decode itself,
and hostile ones: a wrong type deep inside, null inside an array whose elements may not be null, a map
value of the wrong type, duplicate keys inside a nested object, nesting far deeper than the schema, and
a 10^5-element array. Python's reader and the JVM path (through the warm Spark Connect server and a
classic local session) read the same ranges: the same rows, the same dead letters with the same
reasons, each naming the field at fault by its path.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from typing import Any

import pytest
from confluent_kafka import Producer

from onceflow.engine.jvm_checks import jvm_decodable
from onceflow.engine.read_path import PYTHON, decoded_read
from onceflow.executor.slices import SliceRef
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.schemas import nullable
from tests.integration.engine.conformance import assert_conforms, read_in_process, read_tasks, topic_ranges

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCHEMA = {
    "id": "int",
    "items": [{"sku": "string", "qty": "int", "price": "float?"}],
    "ctx": nullable({"ip": "string?", "tags": ["string"]}),
    "counts": "map<string,int>?",
    "grid": "array<array<int?>>?",
}
FORMAT = JsonFormat(schema=SCHEMA, key_field="k")
MAX_BYTES = 1_000_000


def order(n: int, **changes: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "id": n,
        "items": [{"sku": f"s{n}-{i}", "qty": i + 1, "price": i / 4} for i in range(3)],
        "ctx": {"ip": "10.0.0.1", "tags": ["a", "b"]},
        "counts": {"seen": n, "kept": 1},
        "grid": [[1, None], [], [n]],
    }
    document.update(changes)
    return document


def enc(document: Any) -> bytes:
    return json.dumps(document, ensure_ascii=False).encode()


def item(**changes: Any) -> dict[str, Any]:
    return {"sku": "x", "qty": 1, "price": None, **changes}


# Records the JVM must turn into rows itself.
PLAIN_GOOD: list[bytes] = [
    enc(order(1)),
    enc(order(2, ctx=None, counts=None, grid=None)),
    enc({k: v for k, v in order(3).items() if k not in ("ctx", "counts", "grid")}),
    enc(order(4, items=[], ctx={"tags": []}, counts={}, grid=[])),
    enc(order(5, items=[item(extra={"deep": [1, {"x": None}]}, more="ignored")])),
    enc(order(6, items=[item(qty=2**63 - 1, price=7)], ctx={"ip": None, "tags": ["naïve ☃ 😀", ""]})),
    enc(order(7, grid=[[None, None], [0]], counts={"a b": -1, "": 0})),
    enc(order(8, items=[item(sku='quote " and \\ backslash')], unknown={"items": "shadow"})),
]
# Good or bad, Python decides; the JVM may leave them to it.
DOUBTFUL: list[bytes] = [
    b'{"id":9,"items":[{"sku":"a","sku":"b","qty":1}]}',  # duplicate key inside a nested object
    b'{"id":10,"items":[{"sku":"a","qty":"x","qty":2}]}',  # duplicate key: the last one is good
    b'{"id":11,"items":[],"counts":{"a":1,"a":2}}',  # duplicate map key
    enc(order(12, items=[item(sku="😀")])).replace("😀".encode(), b"\\ud83d\\ude00"),  # escaped pair
    enc(order(13, grid=[[0] * 100_000])),  # a 10^5-element array
]
BAD: list[bytes] = [
    enc(order(20, items=[item(), item(), item(), item(qty="1")])),  # items[3].qty
    enc(order(21, items=[item(), None])),  # null inside a non-null array
    enc(order(22, ctx={"ip": "x", "tags": ["a", None]})),  # ctx.tags[1]
    enc(order(23, counts={"ok": 1, "bad": "x"})),  # a map value of the wrong type
    enc(order(24, counts={"ok": None})),  # a null map value where values may not be null
    enc(order(25, items=[item(sku=5)])),  # a number where a string is declared
    enc(order(26, items=[item(sku={"a": 1})])),
    enc(order(27, items=[item(price="1.5")])),
    enc(order(28, items={"sku": "x", "qty": 1})),  # an object where an array is declared
    enc(order(29, ctx=["10.0.0.1"])),  # an array where an object is declared
    enc(order(30, grid=[[1], None])),  # an inner array may not be null
    enc(order(31, grid=[[1, "2"]])),
    enc(order(32, items=[{"sku": "x"}])),  # a missing required field inside an element
    enc(order(33, items=[item(qty=2**63)])),
    enc(order(34, ctx={"tags": "a"})),
    b'{"id":35,"items":[{"sku":"x","qty":1,"price":NaN}]}',
    b'{"id":36,"items":[{"sku":"\\ud800","qty":1}]}',  # a lone surrogate inside a nested string
    b'{"id":37,"items":[],"ctx":{"tags":[],"deep":' + b"[" * 3000 + b"]" * 3000 + b"}}",  # undeclared
    b'{"id":38,"items":[' + b"[" * 100_000 + b"]" * 100_000 + b"]}",  # pathologically deep
]


def _produce(bootstrap: str, topic: str) -> int:
    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 2_000_000})
    values = PLAIN_GOOD + DOUBTFUL + BAD
    for n, value in enumerate(values):
        producer.produce(topic, key=f"k{n}".encode(), value=value, partition=n % 2)
    producer.flush(30)
    return len(values)


def _pipeline(topic: str, tmp: str) -> Pipeline:
    return Pipeline(
        name=f"nested-{uuid.uuid4().hex[:8]}",
        source=KafkaSource(topics=(topic,)),
        format=FORMAT,
        sinks=(SinkSpec("unused", "files", {"root": tmp, "table": "unused"}),),
        max_records_per_task=7,
        max_record_bytes=MAX_BYTES,
    )


def test_nested_json_the_jvm_path_gives_the_python_readers_rows_and_dead_letters(
    settings, make_topic, spark, tmp_path
) -> None:
    assert jvm_decodable(FORMAT) is None
    topic = make_topic("nested", partitions=2, **{"max.message.bytes": "2000000"})
    produced = _produce(settings.kafka_bootstrap, topic)
    ranges = topic_ranges(settings.kafka_bootstrap, topic)
    spec = _pipeline(topic, str(tmp_path))
    ref = SliceRef(spec, 1, 0, tuple(ranges), settings.kafka_bootstrap, settings=settings)
    tasks = read_tasks(spec, ranges)

    rows, dead = read_in_process(ref, tasks)
    assert len(rows) + len(dead) == produced
    accepted = assert_conforms(spark, ref, tasks, (rows, dead)).accepted

    # The JVM decoded every plainly good record itself (and nothing Python rejects: assert_conforms).
    good_at = {(n % 2, n // 2) for n in range(len(PLAIN_GOOD))}
    assert good_at <= accepted, sorted(good_at - accepted)
    # Every bad record is a dead letter whose reason names the place at fault.
    reasons = {(d.partition, d.offset): d.reason for d in dead}
    first_bad = len(PLAIN_GOOD) + len(DOUBTFUL)
    assert len(dead) >= len(BAD)
    for n, expected in {
        first_bad: "items[3].qty",
        first_bad + 1: "items[1]",
        first_bad + 2: "ctx.tags[1]",
        first_bad + 3: 'counts["bad"]',
        first_bad + 5: "items[0].sku",
        first_bad + 12: "items[0].qty",
    }.items():
        reason = reasons[(n % 2, n // 2)]
        assert expected in reason, reason
    # The 10^5-element array became a row with all its elements.
    grids = [r[SCHEMA_COLUMNS.index("grid")] for r in rows if r[0] == 13]
    assert grids and len(grids[0][0]) == 100_000


SCHEMA_COLUMNS = [*SCHEMA, "k"]


def test_a_schema_with_types_the_jvm_does_not_check_reads_in_python(
    settings, make_topic, spark, tmp_path
) -> None:
    fmt = JsonFormat(schema={"id": "int", "at": [{"when": "timestamp", "amount": "decimal(10,2)"}]})
    topic = make_topic("nested", partitions=2)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    producer.produce(
        topic, partition=0, value=b'{"id":1,"at":[{"when":"2026-11-27T10:00:00+01:00","amount":"12.50"}]}'
    )
    producer.flush(30)
    ranges = topic_ranges(settings.kafka_bootstrap, topic)
    spec = Pipeline(
        name=f"nested-{uuid.uuid4().hex[:8]}",
        source=KafkaSource(topics=(topic,)),
        format=fmt,
        sinks=(SinkSpec("unused", "files", {"root": str(tmp_path), "table": "unused"}),),
    )
    chosen = replace(settings, json_read="jvm")
    ref = SliceRef(spec, 1, 0, tuple(ranges), settings.kafka_bootstrap, settings=chosen)
    read = decoded_read(spark, ref, read_tasks(spec, ranges))
    assert read.path == PYTHON
    assert "timestamp" in read.reason
    (row,) = read.frame.collect()
    assert str(row["at"][0]["amount"]) == "12.50"
    assert row["at"][0]["when"] is not None

"""`python -m bench.jvm_read`: decode time of one slice's read, Python path against JVM path, side by side.

Produces ``--records`` JSON records of about 200 bytes (``--format avro``: the same fields as Avro in
the registry's wire format, plus a decimal and a timestamp, about 150 bytes, with their writer schema
in a folder registry) into a fresh topic of 4 partitions, then reads and decodes all of them through
the Spark Connect server (``ONCEFLOW_SPARK_REMOTE``) once with each path of `onceflow.engine.jvm_read`:
the Python reader and decoder in every read task, and Spark's Kafka source with ``from_json`` (or
``from_avro``). Each run does what a slice's step 3 does: decode, collect the dead letters, then
materialize every column of every row (Spark's ``noop`` sink), so neither path can skip work. Writes
the figures to ``--out`` (bench/jvm_read.json, bench/jvm_read_avro.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from onceflow import redact
from onceflow.config import Settings
from onceflow.decoding.schema_registry import FolderSchemaRegistry, wire_value
from onceflow.engine.jvm_avro import writer_plans
from onceflow.engine.jvm_read import DEAD_LETTER_COLUMN, jvm_read, python_read, task_kafka_frame
from onceflow.engine.slice_job import SLICE_SQL_CONF
from onceflow.executor.slices import SliceRef
from onceflow.offsets import OffsetRange
from onceflow.pipeline import AvroFormat, JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.sources.kafka_planning import ReadTask

PARTITIONS = 4
SCHEMA = {
    "id": "int",
    "amount": "float",
    "customer": "string",
    "country": "string",
    "note": "string?",
    "ts": "int",
    "vip": "bool",
}


def record(n: int) -> bytes:
    """One record of about 200 bytes, every field type of the schema."""
    document = {
        "id": n,
        "amount": round((n % 10_000) * 1.37, 2),
        "customer": f"customer-{n % 5_000:05d}",
        "country": ("DE", "FR", "NL", "PL")[n % 4],
        "note": "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor",
        "ts": 1_700_000_000_000 + n,
        "vip": n % 7 == 0,
    }
    return json.dumps(document).encode()


AVRO_ID = 1
AVRO_SCHEMA = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": "double"},
        {"name": "customer", "type": "string"},
        {"name": "country", "type": "string"},
        {"name": "note", "type": ["null", "string"]},
        {"name": "ts", "type": "long"},
        {"name": "vip", "type": "boolean"},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}


def avro_records() -> Any:
    """One Avro record maker (registry wire, id `AVRO_ID`): the JSON record's fields and two logical."""
    import datetime as dt
    from decimal import Decimal

    from fastavro import parse_schema

    parsed = parse_schema(AVRO_SCHEMA)

    def make(n: int) -> bytes:
        document = json.loads(record(n))
        document["price"] = Decimal(n % 100_000) / 100
        document["at"] = dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=n)
        return wire_value(AVRO_ID, parsed, document)

    return make


def produce(bootstrap: str, topic: str, records: int, make: Any = None) -> list[OffsetRange]:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000})
    for n in range(records):
        while True:
            try:
                producer.produce(topic, value=(make or record)(n), partition=n % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-jvm-read"})
    try:
        ends = [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in range(PARTITIONS)
        ]
    finally:
        consumer.close()
    return [OffsetRange(topic, p, low, high) for p, (low, high) in enumerate(ends)]


def timed(build: Any) -> float:
    """Seconds to build a path's decoded frame, collect its dead letters and write every row (to
    Spark's ``noop`` sink), as a slice does; the path's cache is released afterwards."""
    from pyspark.sql import functions as F

    started = time.perf_counter()
    frame, cached = build()
    dead = F.col(DEAD_LETTER_COLUMN)
    frame.where(dead.isNotNull()).select(dead).collect()
    frame.where(dead.isNull()).write.format("noop").mode("overwrite").save()
    seconds = time.perf_counter() - started
    cached.unpersist()
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--format", choices=("json", "avro"), default="json")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    avro = args.format == "avro"
    out = args.out or str(Path(__file__).with_name("jvm_read_avro.json" if avro else "jvm_read.json"))
    from confluent_kafka.admin import AdminClient
    from pyspark import StorageLevel
    from pyspark.sql import SparkSession

    settings = Settings.from_env()
    bootstrap = settings.kafka_bootstrap
    remote = settings.spark_remote
    if remote is None:
        raise SystemExit("set ONCEFLOW_SPARK_REMOTE: this benchmark runs on a Spark Connect server")
    topic = f"bench-jvm-read-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    make = avro_records() if avro else record
    ranges = produce(bootstrap, topic, args.records, make)
    print(f"produced {args.records} records into {topic} in {time.perf_counter() - started:.1f} s")
    fmt: JsonFormat | AvroFormat = JsonFormat(schema=SCHEMA)
    plans: list[Any] = []
    if avro:
        folder = Path(tempfile.mkdtemp(prefix="bench-jvm-read-"))
        (folder / "order.avsc").write_text(json.dumps(AVRO_SCHEMA))
        entry = {"id": AVRO_ID, "subject": "orders-value", "version": 1, "file": "order.avsc"}
        manifest = {"schemas": [entry]}
        (folder / "registry.json").write_text(json.dumps(manifest))
        settings = dataclasses.replace(settings, schema_registry_url=f"file://{folder}")
        fmt = AvroFormat(subject="orders-value").pin(json.dumps(AVRO_SCHEMA))
        plans, _ = writer_plans(fmt, FolderSchemaRegistry(folder), [topic])
    spec = Pipeline(
        name="bench-jvm-read",
        source=KafkaSource(topics=(topic,)),
        format=fmt,
        sinks=(SinkSpec("unused", "files", {"root": "/tmp/unused", "table": "unused"}),),
    )
    pieces = [piece for r in ranges for piece in r.split(spec.max_records_per_task)]
    tasks = [ReadTask(f"t{n}", 0, piece) for n, piece in enumerate(pieces)]
    ref = SliceRef(spec, 1, 0, tuple(ranges), bootstrap, settings=settings)
    spark = SparkSession.builder.remote(remote).create()
    try:
        for key, setting in SLICE_SQL_CONF.items():  # as a slice's session has them
            spark.conf.set(key, setting)
        spark.range(1).collect()  # the session is open before either run is timed

        def python() -> tuple[Any, Any]:
            frame = python_read(spark, ref, tasks).persist(StorageLevel.MEMORY_AND_DISK)
            return frame, frame

        def jvm() -> tuple[Any, Any]:
            frame = jvm_read(task_kafka_frame(spark, bootstrap, tasks), ref, plans)[0].persist(
                StorageLevel.MEMORY_AND_DISK
            )
            return frame, frame

        python_s = timed(python)
        jvm_s = timed(jvm)
    finally:
        spark.stop()
        AdminClient({"bootstrap.servers": bootstrap}).delete_topics([topic])
    result = {
        "format": args.format,
        "records": args.records,
        "partitions": PARTITIONS,
        "read_tasks": len(tasks),
        "record_bytes": len(make(args.records // 2)),
        "python_path_s": round(python_s, 2),
        "jvm_path_s": round(jvm_s, 2),
        "python_records_per_s": round(args.records / python_s),
        "jvm_records_per_s": round(args.records / jvm_s),
        "speedup": round(python_s / jvm_s, 2),
        "spark_remote": redact.url(remote),  # the session token stays out of the committed report
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
    }
    Path(out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

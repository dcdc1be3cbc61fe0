"""`python -m bench.one_parse`: the JVM path's JSON checks, two parses against one, side by side.

onceflow's JVM path (`onceflow.engine.jvm_checks.json_accepted`) parses each JSON value twice: once into
the schema's types (``from_json``, whose corrupt-record column flags any field it could not convert), once
inside an array with a sentinel after it, which proves the value is exactly one JSON object and tells
JSON strings from other values. This step times that against one parse per record: the value parsed
once into a Variant (``try_parse_json``, all-or-nothing, but it stops after the first value, so
inside the same array with a sentinel), its first element cast to a struct of the schema's names, each
field's kind checked (``schema_of_variant``) and its value taken (``try_variant_get``).

Produces ``--records`` records of `bench.jvm_read.record` into a fresh topic of 4 partitions, then,
``--rounds`` times, builds the JVM path's decoded frame (`jvm_read`, the slice's SQL settings) with each
criterion in turn and writes every row to Spark's ``noop`` sink. Writes the seconds of each run and how
many records each criterion left to Python to ``--out`` (bench/one_parse.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from bench.jvm_read import PARTITIONS, SCHEMA, produce
from onceflow import redact
from onceflow.config import Settings
from onceflow.engine.jvm_checks import (
    _RESERVED_ESCAPES,
    _SENTINEL,
    _SENTINEL_SUFFIX,
    _within,
    json_accepted,
    json_row,
)
from onceflow.engine.jvm_read import jvm_read, task_kafka_frame
from onceflow.engine.slice_job import SLICE_SQL_CONF
from onceflow.executor.slices import SliceRef
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.sources.kafka_planning import ReadTask

# Each schema type's kind as `schema_of_variant` names it, and the type its value is taken as.
_KINDS = {"string": ("STRING", "string"), "int": ("BIGINT", "bigint"), "bool": ("BOOLEAN", "boolean")}


def variant_checks(fmt: Any, max_record_bytes: int) -> tuple[Any, list[Any]]:
    """One parse per record: `json_accepted`'s criterion and values from a single Variant of the value.

    Conservative where a Variant cannot tell what Python would see: a duplicate key anywhere fails the
    parse (Python keeps the last), and a float field written as a decimal zero ("-0.0" keeps no sign
    in a Variant's decimal) is left to Python when the value holds a minus sign before a zero.
    """
    from pyspark.sql import functions as F

    if not isinstance(fmt, JsonFormat):
        return json_accepted(fmt, max_record_bytes)
    value = F.col("value")
    text = value.cast("string")
    names = ", ".join(f"`{name.replace('`', '``')}`: variant" for name in fmt.schema)
    # Like `json_accepted`'s shape: the value, then a sentinel it cannot spell, as one array of two.
    document = F.try_parse_json(F.concat(F.lit("["), text, F.lit(_SENTINEL_SUFFIX)))
    fields = F.try_variant_get(document, "$[0]", f"struct<{names}>")  # null unless an object
    sentinel = F.try_variant_get(document, "$[1]", "map<string,bigint>")
    checks = [
        _within(max_record_bytes),
        value.isNotNull(),
        F.is_valid_utf8(value),
        ~(text.contains("\\u") & text.rlike(_RESERVED_ESCAPES)),
        F.try_variant_get(document, "$[2]", "variant").isNull(),
        F.size(sentinel) == 1,
        F.element_at(sentinel, F.lit(_SENTINEL)) == 1,
        fields.isNotNull(),
    ]
    values = []
    for name in fmt.schema:
        base, nullable = fmt.field_type(name)
        field = fields[name]
        kind = F.schema_of_variant(field)
        if base == "float":
            got = F.try_variant_get(field, "$", "double")
            decimal = kind.startswith("DECIMAL")
            number = (kind == "DOUBLE") | (kind == "BIGINT") | decimal
            finite = ~F.isnan(got) & (F.abs(got) != F.lit(float("inf")))
            signless_zero = decimal & (got == 0) & text.contains("-0")
            present = number & finite & ~signless_zero
        else:
            expected, spark_type = _KINDS[base]
            got = F.try_variant_get(field, "$", spark_type)
            present = kind == expected
        absent = field.isNull() | F.is_variant_null(field)
        checks.append(present | absent if nullable else present)
        values.append(F.when(present, got))
    return json_row(fmt, checks, values)


CRITERIA = {"two parses (onceflow)": None, "one Variant parse": variant_checks}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).with_name("one_parse.json")))
    args = parser.parse_args(argv)
    from confluent_kafka.admin import AdminClient
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    settings = Settings.from_env()
    if settings.spark_remote is None:
        raise SystemExit("set ONCEFLOW_SPARK_REMOTE: this benchmark runs on a Spark Connect server")
    bootstrap = settings.kafka_bootstrap
    topic = f"bench-one-parse-{uuid.uuid4().hex[:8]}"
    ranges = produce(bootstrap, topic, args.records)
    print(f"produced {args.records:,} records into {topic}", flush=True)
    spec = Pipeline(
        name="bench-one-parse",
        source=KafkaSource(topics=(topic,)),
        format=JsonFormat(schema=SCHEMA),
        sinks=(SinkSpec("unused", "files", {"root": "/tmp/unused", "table": "unused"}),),
    )
    pieces = [piece for r in ranges for piece in r.split(spec.max_records_per_task)]
    tasks = [ReadTask(f"t{n}", 0, piece) for n, piece in enumerate(pieces)]
    ref = SliceRef(spec, 1, 0, tuple(ranges), bootstrap, settings=settings)
    spark = SparkSession.builder.remote(settings.spark_remote).create()
    seconds: dict[str, list[float]] = {name: [] for name in CRITERIA}
    to_python: dict[str, int] = {}
    try:
        for key, setting in SLICE_SQL_CONF.items():
            spark.conf.set(key, setting)
        for round_number in range(args.rounds):
            for name, checks in CRITERIA.items():
                frame, checked = jvm_read(task_kafka_frame(spark, bootstrap, tasks), ref, (), checks)
                started = time.perf_counter()
                frame.write.format("noop").mode("overwrite").save()
                seconds[name].append(round(time.perf_counter() - started, 2))
                if name not in to_python:
                    to_python[name] = checked.where(~F.col("_accepted")).count()
                print(f"round {round_number + 1}: {name}: {seconds[name][-1]} s", flush=True)
    finally:
        spark.stop()
        AdminClient({"bootstrap.servers": bootstrap}).delete_topics([topic])
    result = {
        "records": args.records,
        "partitions": PARTITIONS,
        "read_tasks": len(tasks),
        "seconds": seconds,
        "median_s": {name: statistics.median(runs) for name, runs in seconds.items()},
        "left_to_python": to_python,
        "spark_remote": redact.url(settings.spark_remote),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

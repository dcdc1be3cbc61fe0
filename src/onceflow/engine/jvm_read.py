"""Step 3 of a slice on Spark: the two reads of exactly the slice's ranges, decoded, as one DataFrame.

Both paths hand the driver the same DataFrame (`decoded_schema`): the format's row columns plus
`DEAD_LETTER_COLUMN` (the dead letter's JSON on a rejected record, null on a row). They give the same
rows and the same dead letters (``tests/integration/engine/test_jvm_conformance.py`` runs both on one
hostile topic). On both, Spark partition i is read task i and holds its records, rows and dead letters
alike, in offset order: each later step is narrow, so the task that reads a range also writes it, in
source order. Which of the two a slice takes is `onceflow.engine.read_path`'s choice.

- **jvm** (`jvm_read`): one Spark Kafka batch read per read task, exactly its ``[from, until)``
  (``read_committed``; ``failOnDataLoss`` on, which still skips transaction markers and aborted records
  but fails when retention deleted offsets of the range), the reads put end to end (a union keeps each
  one's single partition, in task order), JSON decoded by ``from_json`` with the declared schema, Avro
  by spark-avro's ``from_avro`` with the writer schemas the driver planned (`onceflow.engine.jvm_avro`).
  A record becomes a row in the JVM only when every check of `onceflow.engine.jvm_checks` passes; every
  other record crosses to Python in the same task (an Arrow UDF over `onceflow.executor.rejected`), where
  `RowDecoder` gives it its row or its dead letter with the reason, in its place.
- **python** (`python_read`): every read task reads its range with the Python reader (`read_task_batches`) and
  decodes there.

Nothing here caches or counts: the read runs inside the slice's write job.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from onceflow.decoding.records import spark_schema
from onceflow.engine.jvm_avro import WriterPlan
from onceflow.engine.jvm_checks import JsonChecks, avro_checked, json_accepted
from onceflow.executor.arrow_rows import arrow_schema
from onceflow.executor.reading import read_task_batches
from onceflow.executor.rejected import RAW_COLUMNS, decode_rejected_column
from onceflow.executor.slices import SliceRef
from onceflow.offsets import OffsetRange
from onceflow.pipeline import AvroFormat
from onceflow.sources.kafka_planning import ReadTask

# The column that carries a rejected record from a read task to the driver (null on every good row).
DEAD_LETTER_COLUMN = "_onceflow_dead_letter"


def python_read(spark: Any, ref: SliceRef, tasks: Sequence[ReadTask]) -> Any:
    """The Python path: Spark task i reads read task i with the Python reader and decodes it a fetched
    batch at a time (`read_task_batches`); its rows cross to the JVM as Arrow batches."""
    schema = decoded_schema(ref)
    batch_schema = arrow_schema(schema)
    tasks = list(tasks)

    def read(batches: Iterable[Any]) -> Iterator[Any]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield from read_task_batches(ref, tasks[index], batch_schema)

    return spark.range(0, len(tasks), 1, len(tasks)).mapInArrow(read, schema)


def decoded_schema(ref: SliceRef) -> Any:
    """Both paths' output: the format's row columns, all nullable, and the dead-letter column."""
    from pyspark.sql import types as T

    rows = spark_schema(ref.pipeline.format)
    return T.StructType(
        [T.StructField(f.name, f.dataType, True) for f in rows.fields]
        + [T.StructField(DEAD_LETTER_COLUMN, T.StringType(), True)]
    )


def offsets_json(ranges: Iterable[OffsetRange], end: bool) -> str:
    """Spark's per-partition offsets option: ``{"topic": {"0": offset, ...}, ...}``."""
    offsets: dict[str, dict[str, int]] = {}
    for r in ranges:
        offsets.setdefault(r.topic, {})[str(r.partition)] = r.until_offset if end else r.from_offset
    return json.dumps(offsets, sort_keys=True)


# How long the broker may hold a fetch that finds no new record. Spark's Kafka reader asks for the
# partition's earliest and latest offsets after every poll, on the connection where the consumer has
# already sent its next fetch; at the end of the log the broker holds that fetch for this long (Kafka's
# default is 500 ms) before it answers the offsets. An epoch's range ends at or before the end of the
# log, so every task of a caught-up pipeline waited the full default. A read of a planned range never
# waits for records to arrive, so a few milliseconds lose nothing.
FETCH_MAX_WAIT_MS = 10


def kafka_frame(spark: Any, bootstrap: str, ranges: Sequence[OffsetRange]) -> Any:
    """One Spark Kafka batch read of exactly ``ranges``, committed records only: one Spark partition
    per non-empty range (Spark splits none of them without ``minPartitions``)."""
    assign: dict[str, list[int]] = {}
    for r in ranges:
        assign.setdefault(r.topic, []).append(r.partition)
    return (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("assign", json.dumps(assign, sort_keys=True))
        .option("startingOffsets", offsets_json(ranges, end=False))
        .option("endingOffsets", offsets_json(ranges, end=True))
        .option("kafka.isolation.level", "read_committed")
        .option("kafka.fetch.max.wait.ms", str(FETCH_MAX_WAIT_MS))
        .option("failOnDataLoss", "true")
        .option("includeHeaders", "true")
        .load()
    )


def task_kafka_frame(spark: Any, bootstrap: str, tasks: Sequence[ReadTask]) -> Any:
    """The read tasks' ranges as one DataFrame whose partition i is task i's range, in offset order.

    A Kafka read of one non-empty range is one partition, and a union puts its inputs' partitions end
    to end (it keeps no partitioning of its own that could merge them). Spark's ``minPartitions``
    would split a partition in pieces of its own choosing, not the planned tasks'.
    """
    if not tasks or any(t.range.is_empty for t in tasks):
        raise ValueError(f"every read task needs a non-empty range: {[str(t.range) for t in tasks]}")
    frames = [kafka_frame(spark, bootstrap, [task.range]) for task in tasks]
    union = frames[0]
    for frame in frames[1:]:
        union = union.union(frame)
    return union


def jvm_read(
    kafka: Any, ref: SliceRef, plans: Sequence[WriterPlan] = (), json_checks: JsonChecks | None = None
) -> tuple[Any, Any]:
    """The JVM path over a Kafka batch read: rows decoded by Spark, the rest decoded in Python, each
    record in its place.

    Returns the decoded frame and the checked records it derives from (``_accepted`` tells which
    records the JVM decoded itself; ``plans`` are an Avro format's writer schemas to decode;
    ``json_checks`` replaces `json_accepted`, for `bench.one_parse` to time another criterion). Every
    step is a projection, so each partition keeps its records' order: a doubtful record goes to a
    Python UDF whose input is null on every accepted record (the cheap case of a batch without doubtful
    records), and comes back as its row or its dead letter.
    """
    from pyspark.sql import functions as F

    spec = ref.pipeline
    timestamp = F.when(F.col("timestampType") == -1, F.lit(None)).otherwise(F.unix_millis("timestamp"))
    records = kafka.select(
        "topic", "partition", "offset", timestamp.alias("_timestamp"), "key", "value", "headers"
    )
    if isinstance(spec.format, AvroFormat):
        checked = avro_checked(records, spec.format, spec.max_record_bytes, plans)
    else:
        accepted, values = (json_checks or json_accepted)(spec.format, spec.max_record_bytes)
        checked = records.select(*RAW_COLUMNS, F.coalesce(accepted, F.lit(False)).alias("_accepted"), *values)
    schema = decoded_schema(ref)
    doubtful = F.when(~F.col("_accepted"), F.struct(*RAW_COLUMNS))
    # A column of its own, so the UDF runs once per record whatever reads its result below.
    with_python = checked.select(
        "_accepted",
        *(f"_v{i}" for i in range(len(schema.fields) - 1)),
        _rejected_udf(ref, schema)(doubtful).alias("_python"),
    )
    python, jvm = F.col("_python"), F.col("_accepted")
    frame = with_python.select(
        *(
            F.when(jvm, F.col(f"_v{i}").cast(_nullable(f.dataType))).otherwise(python[f.name]).alias(f.name)
            for i, f in enumerate(schema.fields[:-1])
        ),
        F.when(jvm, F.lit(None).cast("string"))
        .otherwise(python[DEAD_LETTER_COLUMN])
        .alias(DEAD_LETTER_COLUMN),
    )
    return frame, checked


def _nullable(data_type: Any) -> Any:
    """``data_type`` with every part nullable: ``from_json`` gives nested values that may be null
    whatever the schema says, and Spark casts a nullable part to a non-nullable one only by refusing.
    (The checks saw that the accepted values have no null where the schema has none; the column
    itself is nullable at the top as it always was.)"""
    from pyspark.sql import types as T

    if isinstance(data_type, T.StructType):
        return T.StructType([T.StructField(f.name, _nullable(f.dataType), True) for f in data_type.fields])
    if isinstance(data_type, T.ArrayType):
        return T.ArrayType(_nullable(data_type.elementType), True)
    if isinstance(data_type, T.MapType):
        return T.MapType(data_type.keyType, _nullable(data_type.valueType), True)
    return data_type


def _rejected_udf(ref: SliceRef, schema: Any) -> Any:
    """An Arrow UDF: a struct of `RAW_COLUMNS` (null for a record the JVM accepted) in, the decoded
    row plus the dead-letter column (null where the input is null) out, one per input, in order."""
    from pyspark.sql.pandas import functions as pandas_functions
    from pyspark.util import PythonEvalType

    fmt, limit = ref.pipeline.format, ref.pipeline.max_record_bytes
    out = arrow_schema(schema)
    registry_url = ref.task.schema_registry_url
    insecure = ref.task.schema_registry_allow_insecure_auth

    def decode(raw: Any) -> Any:
        return decode_rejected_column(raw, fmt, limit, out, registry_url, insecure)

    make: Any = pandas_functions.arrow_udf  # a struct result: the stubs know only atomic ones
    with warnings.catch_warnings():  # the type is given, not inferred from hints: that is on purpose
        warnings.simplefilter("ignore", UserWarning)
        return make(decode, schema, PythonEvalType.SQL_SCALAR_ARROW_UDF)

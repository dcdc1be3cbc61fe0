"""Step 3 of a slice on Spark: read exactly the slice's ranges and decode them, in the JVM where it can.

Two paths hand the driver the same DataFrame: the format's row columns plus `DEAD_LETTER_COLUMN` (the
dead letter's JSON on a rejected record, null on a row). They give the same rows and the same dead
letters (``tests/integration/engine/test_jvm_conformance.py`` runs both on one hostile topic). On both,
Spark partition i is read task i and holds its records, rows and dead letters alike, in offset order:
each later step is narrow, so the task that reads a range also writes it, in source order.

- **jvm**: one Spark Kafka batch read per read task, exactly its ``[from, until)`` (``read_committed``;
  ``failOnDataLoss`` on, which still skips transaction markers and aborted records but fails when
  retention deleted offsets of the range), the reads put end to end (a union keeps each one's single
  partition, in task order), JSON decoded by ``from_json`` with the declared schema, Avro by
  spark-avro's ``from_avro`` with the writer schemas the driver planned (`onceflow.engine.jvm_avro`). A
  record becomes a row in the JVM only when every check (`_accepted`, `_avro_checked`) passes; every
  other record crosses to Python in the same task (an Arrow UDF over `onceflow.executor.rejected`), where
  `RowDecoder` gives it its row or its dead letter with the reason, in its place. The checks are
  conservative: a good record may go to Python, but the JVM never accepts a record that Python would
  reject, nor gives a value Python would not.
- **python**: every read task reads its range with the Python reader (`read_task`) and decodes there.
  Used when a fault plan is armed (crash and pause points such as ``task_mid_read`` live in the Python
  reader), when the session cannot load Spark's Kafka source (a spark-submit driver without its jar),
  for a schema whose field names contain the control character the JVM checks reserve, and for Avro
  when the session has no spark-avro or no writer schema of the slice can be decoded in the JVM.

Nothing here caches or counts: the read runs inside the slice's write job.
"""

from __future__ import annotations

import json
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from onceflow.decoding.avro_records import registry_for
from onceflow.decoding.records import row_columns, spark_schema
from onceflow.engine.jvm_avro import WriterPlan, decode_checks, decoded_columns, plan_all, writer_plans
from onceflow.executor.arrow_rows import arrow_schema, row_batches
from onceflow.executor.reading import read_task
from onceflow.executor.rejected import RAW_COLUMNS, decode_rejected_column, with_dead_letters
from onceflow.executor.slices import SliceRef
from onceflow.faults import plan_armed
from onceflow.offsets import OffsetRange
from onceflow.pipeline import AvroFormat, JsonFormat
from onceflow.sources.kafka_planning import ReadTask

# The column that carries a rejected record from a read task to the driver (null on every good row).
DEAD_LETTER_COLUMN = "_onceflow_dead_letter"
PYTHON, JVM = "python", "jvm"

# A JSON value is accepted in the JVM only as the first element of ``[value,{"\u0001":1}]`` with the
# sentinel object second: a value with anything after its first JSON value cannot end that array there.
# A value that spells the sentinel's key itself (an escaped U+0001) goes to Python; so does one with an
# escaped UTF-16 surrogate, which Python keeps as a lone code point and Java does not.
_SENTINEL = "\x01"
_SENTINEL_SUFFIX = ',{"\\u0001":1}]'
_RESERVED_ESCAPES = r"\\u(?:0001|[dD][89a-fA-F])"
_CORRUPT = "\x01onceflow_corrupt"
# Jackson as strict as Python's json module: Spark's defaults allow single quotes and NaN/Infinity.
_JSON_OPTIONS = {
    "mode": "PERMISSIVE",
    "allowSingleQuotes": "false",
    "allowNonNumericNumbers": "false",
    "allowComments": "false",
    "allowUnquotedFieldNames": "false",
    "allowNumericLeadingZeros": "false",
    "allowBackslashEscapingAnyCharacter": "false",
    "allowUnquotedControlChars": "false",
}


@dataclass
class DecodedRead:
    """The slice's decoded records as one DataFrame (partition i is read task i, in offset order), and
    which path produced it, with why."""

    frame: Any
    path: str
    reason: str
    # The inputs of its physical plan: one Kafka scan per read task on the JVM path, one range on the
    # Python path. The one-pass check compares a transform's plan with it, without a second explain.
    leaves: int = 1


def decoded_read(spark: Any, ref: SliceRef, tasks: Sequence[ReadTask]) -> DecodedRead:
    """The slice's records, rows and dead letters together, one Spark partition per read task.

    The path rule: Python when a fault plan is armed, for JSON unless the settings choose the JVM
    (`Settings.json_read`; a schema name holding the reserved character keeps it in Python), and for
    Avro of which no writer schema can be decoded in the JVM; else the JVM, unless the session has no
    Kafka source, or no spark-avro for Avro (then Python, and the reason says so).
    """
    fmt = ref.pipeline.format
    reason = None
    plans: list[WriterPlan] = []
    if plan_armed():  # crash and pause points sit in the Python reader
        reason = "a fault plan is armed"
    elif isinstance(fmt, JsonFormat) and ref.settings.json_read == "python":
        reason = "ONCEFLOW_JSON_READ=python, the default"
    elif isinstance(fmt, JsonFormat) and any(_SENTINEL in name for name, _, _ in row_columns(fmt)):
        reason = "a schema field name holds U+0001"
    elif isinstance(fmt, AvroFormat):
        registry = registry_for(ref.settings.schema_registry_url) if fmt.wire == "registry" else None
        topics = sorted({r.topic for r in ref.slice_ranges})
        plans, notes = writer_plans(fmt, registry, topics)
        if not plans:
            why = f": {notes[0]}" if notes else ""
            reason = f"no writer schema of the Avro records can be decoded in the JVM{why}"
    if reason is None:
        slice_ranges(ref, tasks)  # the tasks cover exactly the slice's ranges
        kafka, reason = kafka_source_missing(lambda: task_kafka_frame(spark, ref.bootstrap, tasks), spark)
        if reason is None and not isinstance(fmt, AvroFormat):
            frame, _ = jvm_read(kafka, ref)
            return DecodedRead(frame, JVM, "Spark's Kafka source and from_json", len(tasks))
        if reason is None:
            read, reason = avro_functions_missing(lambda: jvm_read(kafka, ref, plans)[0], spark)
            if reason is None:
                how = f"Spark's Kafka source and from_avro ({len(plans)} writer schemas)"
                return DecodedRead(read, JVM, how, len(tasks))
    return DecodedRead(python_read(spark, ref, tasks), PYTHON, reason)


def python_read(spark: Any, ref: SliceRef, tasks: Sequence[ReadTask]) -> Any:
    """The Python path: Spark task i reads read task i with the Python reader and decodes it; its rows
    cross to the JVM as Arrow batches."""
    schema = decoded_schema(ref)
    batch_schema = arrow_schema(schema)
    width = len(schema.fields) - 1
    tasks = list(tasks)

    def read(batches: Iterable[Any]) -> Iterator[Any]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                items = read_task(ref, tasks[index])
                yield from row_batches(with_dead_letters(items, width), batch_schema)

    return spark.range(0, len(tasks), 1, len(tasks)).mapInArrow(read, schema)


def decoded_schema(ref: SliceRef) -> Any:
    """Both paths' output: the format's row columns, all nullable, and the dead-letter column."""
    from pyspark.sql import types as T

    rows = spark_schema(ref.pipeline.format)
    return T.StructType(
        [T.StructField(f.name, f.dataType, True) for f in rows.fields]
        + [T.StructField(DEAD_LETTER_COLUMN, T.StringType(), True)]
    )


def slice_ranges(ref: SliceRef, tasks: Sequence[ReadTask]) -> list[OffsetRange]:
    """Per partition, the one range the slice's tasks cover, checked to be exactly the slice's range."""
    covered: dict[tuple[str, int], OffsetRange] = {}
    for task in sorted(tasks, key=lambda t: (t.range.topic, t.range.partition, t.range.from_offset)):
        r = task.range
        if r.is_empty:
            continue
        key = (r.topic, r.partition)
        before = covered.get(key)
        if before is not None and before.until_offset != r.from_offset:
            raise ValueError(f"read tasks of {r.topic}[{r.partition}] leave a gap or overlap at {r}")
        start = r.from_offset if before is None else before.from_offset
        covered[key] = OffsetRange(r.topic, r.partition, start, r.until_offset)
    planned = {(r.topic, r.partition): r for r in ref.slice_ranges if not r.is_empty}
    if planned != covered:
        raise ValueError(f"read tasks cover {sorted(covered.values())}, the slice {sorted(planned.values())}")
    return sorted(covered.values())


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


def kafka_source_missing(load: Callable[[], Any], session: Any = None) -> tuple[Any, str | None]:
    """The Kafka read ``load`` builds, and None; or None and why the session has no Kafka source.

    Resolving the read's schema loads the source (no record is read; a classic session resolves it
    in ``load`` already). Only a missing source is an answer here: any other failure (Kafka
    unreachable, a bad range) is the slice's failure. A ``session`` that had the source once is not
    asked again (`_resolved`).
    """
    markers = ("DATA_SOURCE_NOT_FOUND", "Failed to find data source: kafka")
    return _resolved(load, markers, "this Spark session has no Kafka source on its classpath", session)


def avro_functions_missing(build: Callable[[], Any], session: Any = None) -> tuple[Any, str | None]:
    """The frame ``build`` makes, and None; or None and why the session has no spark-avro.

    A classic session fails while building ``from_avro`` without the jar, a Spark Connect server when
    it resolves the plan; any other failure is the slice's.
    """
    markers = ("'JavaPackage' object is not callable", "AVRO_NOT_LOADED")
    missing = "this Spark session has no spark-avro (from_avro) on its classpath"
    return _resolved(build, markers, missing, session)


# The sessions that were found to have each thing `_resolved` asks about. A server's classpath does not
# change while it runs, and a session on a restarted server is a new session object (`onceflow.engine.
# connect` opens another when the old one stops answering), so a follower asks once, not every epoch:
# each question is a round trip that plans the whole read on the server.
_FOUND: dict[str, weakref.WeakSet[Any]] = {}


def _resolved(
    build: Callable[[], Any], markers: Sequence[str], missing: str, session: Any = None
) -> tuple[Any, str | None]:
    """The frame ``build`` makes, its plan resolved (on the server, for Spark Connect), and None; or
    None and ``missing`` when the failure names one of ``markers``. Any other failure is raised.
    When ``session`` resolved such a frame before, the frame is built and not resolved again."""
    found = _FOUND.setdefault(missing, weakref.WeakSet())
    if session is not None and session in found:
        return build(), None
    try:
        frame = build()
        frame.schema  # noqa: B018 - resolves the plan
    except Exception as exc:
        if any(marker in str(exc) for marker in markers):
            return None, missing
        raise
    if session is not None:
        found.add(session)
    return frame, None


# The JSON accept criterion and row values of `jvm_read`: `_accepted`'s signature.
JsonChecks = Callable[[Any, int], tuple[Any, list[Any]]]


def jvm_read(
    kafka: Any, ref: SliceRef, plans: Sequence[WriterPlan] = (), json_checks: JsonChecks | None = None
) -> tuple[Any, Any]:
    """The JVM path over a Kafka batch read: rows decoded by Spark, the rest decoded in Python, each
    record in its place.

    Returns the decoded frame and the checked records it derives from (``_accepted`` tells which
    records the JVM decoded itself; ``plans`` are an Avro format's writer schemas to decode;
    ``json_checks`` replaces `_accepted`, for `bench.one_parse` to time another criterion). Every
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
        checked = _avro_checked(records, spec.format, spec.max_record_bytes, plans)
    else:
        accepted, values = (json_checks or _accepted)(spec.format, spec.max_record_bytes)
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
            F.when(jvm, F.col(f"_v{i}").cast(f.dataType)).otherwise(python[f.name]).alias(f.name)
            for i, f in enumerate(schema.fields[:-1])
        ),
        F.when(jvm, F.lit(None).cast("string"))
        .otherwise(python[DEAD_LETTER_COLUMN])
        .alias(DEAD_LETTER_COLUMN),
    )
    return frame, checked


def _rejected_udf(ref: SliceRef, schema: Any) -> Any:
    """An Arrow UDF: a struct of `RAW_COLUMNS` (null for a record the JVM accepted) in, the decoded
    row plus the dead-letter column (null where the input is null) out, one per input, in order."""
    from pyspark.sql.pandas import functions as pandas_functions
    from pyspark.util import PythonEvalType

    fmt, limit = ref.pipeline.format, ref.pipeline.max_record_bytes
    out = arrow_schema(schema)
    registry_url = ref.settings.schema_registry_url

    def decode(raw: Any) -> Any:
        return decode_rejected_column(raw, fmt, limit, out, registry_url)

    make: Any = pandas_functions.arrow_udf  # a struct result: the stubs know only atomic ones
    with warnings.catch_warnings():  # the type is given, not inferred from hints: that is on purpose
        warnings.simplefilter("ignore", UserWarning)
        return make(decode, schema, PythonEvalType.SQL_SCALAR_ARROW_UDF)


def _accepted(fmt: Any, max_record_bytes: int) -> tuple[Any, list[Any]]:
    """The JVM's accept criterion and the row's values (``_v0``, ``_v1``, ... in `row_columns` order).

    Accepted only if all hold, each a check Python makes too (a failed one sends the record to Python):
    key plus value within ``max_record_bytes``; for JSON, a value that is valid UTF-8 and exactly one
    JSON object (strict syntax, nothing after it); every field converted by ``from_json`` without a
    failure (ints within 64 bits, floats finite, bools, and strings that are JSON strings), present or
    JSON null only where nullable; a key that is valid UTF-8 when the format takes it.
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    key, value = F.col("key"), F.col("value")
    within = _within(max_record_bytes)
    meta = [F.col(name) for name in _META]
    if not isinstance(fmt, JsonFormat):
        return within, [c.alias(f"_v{i}") for i, c in enumerate([key, value, *meta])]

    text = value.cast("string")
    typed_fields, element_fields = [], [T.StructField(_SENTINEL, T.LongType())]
    spark_types = {
        "string": T.StringType(),
        "int": T.LongType(),
        "float": T.DoubleType(),
        "bool": T.BooleanType(),
    }
    for name in fmt.schema:
        base, _ = fmt.field_type(name)
        typed_fields.append(T.StructField(name, spark_types[base]))
        if base == "string":
            element_fields.append(T.StructField(name, T.VariantType()))
    typed_schema = T.StructType([*typed_fields, T.StructField(_CORRUPT, T.StringType())])
    # The whole value, strictly: exactly one JSON object, then only whitespace.
    shape = F.from_json(
        F.concat(F.lit("["), text, F.lit(_SENTINEL_SUFFIX)),
        T.ArrayType(T.StructType(element_fields)),
        _JSON_OPTIONS,
    )
    typed = F.from_json(text, typed_schema, {**_JSON_OPTIONS, "columnNameOfCorruptRecord": _CORRUPT})
    checks = [
        within,
        value.isNotNull(),
        F.is_valid_utf8(value),
        ~(text.contains("\\u") & text.rlike(_RESERVED_ESCAPES)),
        F.size(shape) == 2,
        shape[1][_SENTINEL] == 1,
        typed.isNotNull(),
        typed[_CORRUPT].isNull(),
    ]
    values = []
    for name in fmt.schema:
        base, nullable = fmt.field_type(name)
        field = typed[name]
        if base == "float":
            present = field.isNotNull() & ~F.isnan(field) & (F.abs(field) != F.lit(float("inf")))
        elif base == "string":
            present = field.isNotNull() & (F.schema_of_variant(shape[0][name]) == F.lit("STRING"))
        else:
            present = field.isNotNull()
        # A null from a parse without failure is a missing field or a JSON null: a row only if nullable.
        checks.append(present | field.isNull() if nullable else present)
        values.append(field)
    return json_row(fmt, checks, values)


def json_row(fmt: JsonFormat, checks: list[Any], values: list[Any]) -> tuple[Any, list[Any]]:
    """A JSON criterion's end: the key's checks and text where the format takes the key, every check
    joined into one, and the row's values named ``_v0``, ``_v1``, ... with the metadata last."""
    from pyspark.sql import functions as F

    if fmt.key_field is not None:
        checks = [*checks, *_key_checks()]
        values = [*values, F.col("key").cast("string")]
    accepted = checks[0]
    for check in checks[1:]:
        accepted = accepted & check
    meta = [F.col(name) for name in _META]
    return accepted, [c.alias(f"_v{i}") for i, c in enumerate([*values, *meta])]


# The record's metadata columns, the last of every row's values (after the key's text, if taken).
_META = ("topic", "partition", "offset", "_timestamp")


def _within(max_record_bytes: int) -> Any:
    """Key plus value within ``max_record_bytes`` (Python dead-letters a larger record as oversized)."""
    from pyspark.sql import functions as F

    key, value = F.col("key"), F.col("value")
    size = F.coalesce(F.octet_length(key), F.lit(0)) + F.coalesce(F.octet_length(value), F.lit(0))
    return size <= F.lit(max_record_bytes)


def _key_checks() -> list[Any]:
    """A key there and valid UTF-8, for a format that takes the key as a column."""
    from pyspark.sql import functions as F

    key = F.col("key")
    return [key.isNotNull(), F.is_valid_utf8(key)]


def _avro_checked(records: Any, fmt: AvroFormat, max_record_bytes: int, plans: Sequence[WriterPlan]) -> Any:
    """`RAW_COLUMNS`, ``_accepted`` and the row's values (``_v0``, ...) of Avro records, in two steps:
    each body decoded once by the plan of its schema id (`jvm_avro.decoded_columns`), then checked.

    Accepted only if all hold: key plus value within ``max_record_bytes``; a value with a planned
    schema id (or a plain body) that the plan's checks prove decoded as fastavro would
    (`jvm_avro.decode_checks`); a key that is valid UTF-8 when the format takes it.
    """
    from pyspark.sql import functions as F

    if not plans:
        raise ValueError("the JVM decodes Avro records only with at least one planned writer schema")
    key, value = F.col("key"), F.col("value")
    # The checks read each decoded body several times. A column that is not deterministic (the
    # task's partition), read by the checks, keeps Spark's optimizer from pushing a filter on them
    # through this step, which would inline (and so repeat) every decode into every check.
    decoded = records.select(
        *RAW_COLUMNS,
        *decoded_columns(plans, value, fmt.wire == "plain"),
        F.spark_partition_id().alias("_task"),
    )
    checks = [F.col("_task") >= 0, _within(max_record_bytes), value.isNotNull()]
    if fmt.key_field is not None:
        checks += _key_checks()
    matched = F.lit(False)
    values: list[Any] = []
    for k, plan in enumerate(plans):
        ok, plan_values = decode_checks(plan, k)
        matched = matched | F.coalesce(ok, F.lit(False))
        which = F.col(f"_d{k}").isNotNull()
        values = (
            [F.when(which, v) for v in plan_values]
            if not values
            else [before.when(which, v) for before, v in zip(values, plan_values, strict=True)]
        )
    accepted = plan_all([matched, *checks])
    if fmt.key_field is not None:
        values.append(key.cast("string"))
    meta = [F.col(name) for name in _META]
    return decoded.select(
        *RAW_COLUMNS,
        F.coalesce(accepted, F.lit(False)).alias("_accepted"),
        *(c.alias(f"_v{i}") for i, c in enumerate([*values, *meta])),
    )

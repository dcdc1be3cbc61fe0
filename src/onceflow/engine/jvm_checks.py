"""What the JVM read path may take on: the checks that decide which records Spark decodes itself, and
whether a session and a slice's read tasks have what that path needs.

The record checks (`json_accepted`, `avro_checked`) are conservative: a good record may go to Python,
but the JVM never accepts a record that Python would reject, nor gives a value Python would not. A
record that fails one crosses to Python in its place (`onceflow.engine.jvm_read`), where it gets its row
or its dead letter with the reason. The session checks (`kafka_source_missing`,
`avro_functions_missing`) tell a session without Spark's Kafka source or spark-avro from a failing
read, so that the slice reads on the Python path instead (`onceflow.engine.read_path`).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from onceflow.decoding.records import row_columns
from onceflow.engine.jvm_avro import WriterPlan, decode_checks, decoded_columns, plan_all
from onceflow.executor.rejected import RAW_COLUMNS
from onceflow.executor.slices import SliceRef
from onceflow.offsets import OffsetRange
from onceflow.pipeline import AvroFormat, JsonFormat
from onceflow.schemas.types import (
    Array,
    DecimalType,
    Map,
    Primitive,
    SchemaType,
    Struct,
    parse_type,
    render,
    struct_fields,
    walk,
    with_nullable,
)
from onceflow.sources.kafka_planning import ReadTask

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


def reserved_field_name(fmt: JsonFormat) -> bool:
    """Whether a field name of ``fmt`` holds the character the JSON checks reserve for their sentinel:
    such a schema cannot be checked in the JVM, so it is read in Python. Nested struct fields count too."""
    nested = (
        name
        for declared in fmt.schema.values()
        for inner in walk(parse_type(declared))
        for name, _ in struct_fields(inner)
    )
    return any(_SENTINEL in name for name in itertools.chain((n for n, _, _ in row_columns(fmt)), nested))


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


# A JSON accept criterion and its row values: `json_accepted`'s signature.
JsonChecks = Callable[[Any, int], tuple[Any, list[Any]]]


def json_accepted(fmt: Any, max_record_bytes: int) -> tuple[Any, list[Any]]:
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
    fields = [(name, parse_type(fmt.schema[name])) for name in fmt.schema]
    typed_fields = [T.StructField(name, _typed_type(T, t)) for name, t in fields]
    # The string values again, as Variants: from_json would give the text of a number or an object
    # declared a string; a Variant tells what the JSON value was.
    element_fields = [T.StructField(_SENTINEL, T.LongType())] + [
        T.StructField(name, _shape_type(T, t)) for name, t in fields if _has_strings(t)
    ]
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
    for name, t in fields:
        # A null from a parse without failure is a missing field or a JSON null: a row only if nullable.
        checks.append(_conforms(typed[name], shape[0][name] if _has_strings(t) else None, t))
        values.append(typed[name])
    return json_row(fmt, checks, values)


# The declared types the JVM decodes itself, at any depth of structs, arrays and maps; a format with any
# other (timestamps, dates, decimals, bytes, json) is read in Python (`jvm_decodable`).
_JVM_SCALARS = frozenset({"string", "int", "float", "bool"})


def jvm_decodable(fmt: JsonFormat) -> str | None:
    """None when the JVM checks can decode every field of ``fmt``; else the type that keeps it in
    Python, for the read's reason."""
    for name in fmt.schema:
        for inner in walk(parse_type(fmt.schema[name])):
            if isinstance(inner, DecimalType) or (
                isinstance(inner, Primitive) and inner.name not in _JVM_SCALARS
            ):
                return render(with_nullable(inner, False))
    return None


def _typed_type(T: Any, t: SchemaType) -> Any:
    """The Spark type ``from_json`` reads a declared type as (every part nullable: the checks, not
    the parse, decide what may be null)."""
    if isinstance(t, Struct):
        return T.StructType([T.StructField(n, _typed_type(T, f)) for n, f in t.fields])
    if isinstance(t, Array):
        return T.ArrayType(_typed_type(T, t.element))
    if isinstance(t, Map):
        return T.MapType(T.StringType(), _typed_type(T, t.value))
    scalar = t.name if isinstance(t, Primitive) else ""
    return {"string": T.StringType(), "int": T.LongType(), "float": T.DoubleType(), "bool": T.BooleanType()}[
        scalar
    ]


def _has_strings(t: SchemaType) -> bool:
    return any(isinstance(inner, Primitive) and inner.name == "string" for inner in walk(t))


def _shape_type(T: Any, t: SchemaType) -> Any:
    """The part of a type that holds strings, with each string a Variant (``_has_strings(t)``)."""
    if isinstance(t, Struct):
        return T.StructType([T.StructField(n, _shape_type(T, f)) for n, f in t.fields if _has_strings(f)])
    if isinstance(t, Array):
        return T.ArrayType(_shape_type(T, t.element))
    if isinstance(t, Map):
        return T.MapType(T.StringType(), _shape_type(T, t.value))
    return T.VariantType()


def _conforms(typed: Any, shape: Any, t: SchemaType) -> Any:
    """Whether a parsed value is what Python makes of it for type ``t``: null only where nullable (a
    missing field or a JSON null), floats finite, strings JSON strings (``shape``: the same value as
    `_shape_type` reads it, None when ``t`` holds no string), and so on inside structs, arrays and
    maps. Never null: a check that cannot tell is False, and the record goes to Python."""
    from pyspark.sql import functions as F

    if isinstance(t, Struct):
        inner = F.lit(True)
        for name, field in t.fields:
            inner = inner & _conforms(typed[name], shape[name] if _has_strings(field) else None, field)
    elif isinstance(t, Array | Map):
        element = t.element if isinstance(t, Array) else t.value
        items = typed if isinstance(t, Array) else F.map_values(typed)
        if shape is None:
            inner = F.forall(items, lambda x: _conforms(x, None, element))
        else:
            shapes = shape if isinstance(t, Array) else F.map_values(shape)
            oks = F.zip_with(items, shapes, lambda x, s: _conforms(x, s, element))
            inner = F.forall(oks, lambda ok: ok)
    elif isinstance(t, Primitive) and t.name == "float":
        inner = ~F.isnan(typed) & (F.abs(typed) != F.lit(float("inf")))
    elif isinstance(t, Primitive) and t.name == "string":
        inner = F.schema_of_variant(shape) == F.lit("STRING")
    else:
        inner = F.lit(True)
    present = typed.isNotNull() & F.coalesce(inner, F.lit(False))
    return (typed.isNull() | present) if t.nullable else present


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


def avro_checked(records: Any, fmt: AvroFormat, max_record_bytes: int, plans: Sequence[WriterPlan]) -> Any:
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

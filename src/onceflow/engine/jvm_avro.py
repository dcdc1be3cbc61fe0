"""Avro records decoded in the JVM (spark-avro's ``from_avro``), only where that is provably what the
Python decoder (`onceflow.decoding.avro_records`, fastavro) would give.

The driver plans, at slice time, which writer schemas the JVM may decode (`writer_plans`): the plain
wire's one writer schema, or the registry's writer schemas it can list (every version of the format's
subject, or of ``<topic>-value`` for a reader schema from a file), each checked against the reader
schema by `writer_plan`. A record is a row in the JVM only when its value is the magic byte 0 and the
id of a planned schema (or a plain body) and every check of `decode_checks` holds; every other record
crosses to Python in its place (`onceflow.engine.jvm_read`), where the dead letter and its reason are
made. Why each check:

- The body is decoded in the writer's own shape (``from_avro`` with the writer schema, and as reader
  schema the same plus a boolean sentinel field with a default): spark-avro's PERMISSIVE mode turns a
  body that fails into a row of nulls, which only the sentinel tells apart from a record of nulls.
- Java's decoder ignores bytes after the record and reads any boolean byte other than 1 as false;
  fastavro refuses the first and reads the second as true. So the decoded record is encoded again
  (``to_avro``, Avro's shortest encoding) and must give the body back byte for byte: the body is then
  one record, every value in its shortest encoding, every boolean byte 0 or 1. A body in a longer
  (legal) encoding goes to Python: conservative. One expression does it, where checking each field's
  length and offset took hundreds and made Spark's generated code too large to compile.
- Strings must be valid UTF-8 (Java keeps the bytes as they are, fastavro refuses them); a uuid must
  already be in the lowercase canonical form (fastavro rewrites other spellings); timestamps and dates
  must lie within years 1 to 9999 (Python's datetime range); rebasing between calendars is off.
- A fixed decimal longer than 8 bytes with a precision of 18 or less is truncated by spark-avro to a
  long before its precision is checked: such writer schemas go to Python wholly. A bytes decimal that
  could be truncated is longer than its value's shortest encoding, so the round trip sends it on.
- Resolution from writer to reader is done here, field by field, for the cases where the two decoders
  agree: a reader field with exactly the writer field's type (names, symbols, sizes, logical types and
  their parameters alike), optionally made nullable on either side (a null for a reader field that is
  not nullable goes to Python), or absent from the writer with a default that both decoders read the
  same (null for a union; a value for string, int, long, double or boolean). Any other difference
  (type promotions, aliases, renamed records, defaults of other types), and writer schemas with named
  type references, nested records, arrays, maps or other unions, send that writer schema's records to
  Python wholly.

The planning is pure Python; the expressions import PySpark lazily. Nothing here touches the ledger or
the coordinator: the checks run in Spark tasks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The options of every JVM decode: nulls (not a failed task) for a body that does not decode, and no
# rebasing of dates and timestamps between calendars (Python's are proleptic Gregorian throughout).
FROM_AVRO_OPTIONS = {"mode": "PERMISSIVE", "datetimeRebaseMode": "CORRECTED"}
# At most this many writer schemas per slice get a JVM decoder (the newest): each is one expression.
MAX_PLANNED_WRITERS = 16

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_NAMESPACE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*)?\Z")
_PRIMITIVES = ("boolean", "int", "long", "float", "double", "string", "bytes")
_LOGICAL = {
    ("long", "timestamp-millis"),
    ("long", "timestamp-micros"),
    ("int", "date"),
    ("string", "uuid"),
}
_UUID = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
# Python's datetime range, years 1 to 9999: microseconds and days from the Unix epoch.
_MICROS_RANGE = (-62_135_596_800_000_000, 253_402_300_799_999_999)
_DAYS_RANGE = (-719_162, 2_932_896)
# The (base, Python types) of the reader defaults both decoders read alike.
_DEFAULTS: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "int": (int,),
    "long": (int,),
    "double": (int, float),
    "boolean": (bool,),
}


class NotPlanned(Exception):
    """Why a writer schema's records are not decoded in the JVM (they are decoded in Python)."""


@dataclass(frozen=True)
class AvroType:
    """One field's type as both decoders see it: the base type with what identifies it exactly."""

    base: str  # an Avro primitive, "enum" or "fixed"
    logical: str | None = None
    precision: int = 0
    scale: int = 0
    size: int = 0
    name: str | None = None
    namespace: str | None = None
    symbols: tuple[str, ...] = ()

    def to_json(self) -> Any:
        """The type as Avro JSON, with only what both decoders read (no custom properties)."""
        if self.base in ("enum", "fixed"):
            named: dict[str, Any] = {"type": self.base, "name": self.name}
            if self.namespace is not None:
                named["namespace"] = self.namespace
            if self.base == "enum":
                named["symbols"] = list(self.symbols)
            else:
                named["size"] = self.size
        else:
            named = {"type": self.base}
        if self.logical == "decimal":
            named.update(logicalType="decimal", precision=self.precision, scale=self.scale)
        elif self.logical is not None:
            named["logicalType"] = self.logical
        return named


@dataclass(frozen=True)
class WriterField:
    name: str
    type: AvroType
    nullable: bool
    null_first: bool = True  # where null sits in the union (``["null", T]`` or ``[T, "null"]``)

    def to_json(self) -> Any:
        if not self.nullable:
            return {"name": self.name, "type": self.type.to_json()}
        branches = ["null", self.type.to_json()]
        return {"name": self.name, "type": branches if self.null_first else branches[::-1]}


@dataclass(frozen=True)
class ReaderColumn:
    """Where a reader field's value comes from: a writer field, or a default (``source`` None)."""

    name: str
    nullable: bool
    source: str | None
    default: Any = None


@dataclass(frozen=True)
class WriterPlan:
    """How the JVM decodes one writer schema's records: ``schema_id`` None for the plain wire."""

    schema_id: int | None
    fields: tuple[WriterField, ...]
    columns: tuple[ReaderColumn, ...]
    writer_json: str  # what ``from_avro`` is given as the writer schema
    decode_json: str  # its ``avroSchema``: the writer schema plus the sentinel field
    sentinel: str


def writer_plan(reader_text: str, writer_text: str, schema_id: int | None) -> WriterPlan:
    """The JVM decoding of ``writer_text``'s records read with ``reader_text``; `NotPlanned` if the
    JVM cannot be shown to decode them as fastavro does (see the module's docstring)."""
    reader, writer = _record(reader_text, "reader"), _record(writer_text, "writer")
    from fastavro import parse_schema

    try:  # what fastavro cannot parse, Python rejects wholly: the JVM must not decode it
        parse_schema(dict(writer))
    except Exception as exc:  # fastavro raises several kinds for a bad schema
        raise NotPlanned(f"fastavro does not parse the writer schema ({type(exc).__name__})") from exc
    if (reader.get("name"), reader.get("namespace")) != (writer.get("name"), writer.get("namespace")):
        raise NotPlanned("the writer's record name or namespace is not the reader's")
    named: set[tuple[str | None, str]] = set()
    fields = tuple(_writer_field(f, named) for f in writer["fields"])
    by_name = {f.name: f for f in fields}
    if len(by_name) != len(fields):
        raise NotPlanned("the writer repeats a field name")
    columns = []
    for field in reader["fields"]:
        name = field.get("name")
        if "aliases" in field:
            raise NotPlanned(f"reader field {name!r} has aliases")
        wanted = _writer_field(field, set())
        source = by_name.get(name)
        if source is not None:
            if source.type != wanted.type:
                raise NotPlanned(f"field {name!r} has another type in the writer schema")
            columns.append(ReaderColumn(name, wanted.nullable, name))
            continue
        if "default" not in field:
            raise NotPlanned(f"reader field {name!r} is not in the writer schema and has no default")
        default = field["default"]
        if wanted.nullable:
            if default is not None:
                raise NotPlanned(f"reader field {name!r}: a union's default other than null")
        elif (
            wanted.type.logical is not None
            or wanted.type.base not in _DEFAULTS
            or type(default) not in _DEFAULTS[wanted.type.base]
            or (type(default) is int and not -(2**63) <= default < 2**63)
            or (wanted.type.base == "int" and not -(2**31) <= default < 2**31)
        ):
            raise NotPlanned(f"reader field {name!r}: a default the decoders may read differently")
        columns.append(ReaderColumn(name, wanted.nullable, None, default))
    sentinel = "_onceflow_decoded"
    while sentinel in by_name:
        sentinel += "_"
    shape: dict[str, Any] = {"type": "record", "name": writer["name"]}
    if writer.get("namespace") is not None:
        shape["namespace"] = writer["namespace"]
    written = {**shape, "fields": [f.to_json() for f in fields]}
    decode = {
        **shape,
        "fields": [*written["fields"], {"name": sentinel, "type": "boolean", "default": True}],
    }
    return WriterPlan(schema_id, fields, tuple(columns), json.dumps(written), json.dumps(decode), sentinel)


def writer_plans(fmt: Any, registry: Any, topics: Sequence[str]) -> tuple[list[WriterPlan], list[str]]:
    """The writer schemas whose records this slice may decode in the JVM, and why others may not.

    ``fmt`` is a pinned `onceflow.pipeline.AvroFormat`; ``registry`` the deployment's (for the
    registry wire). Only schemas the registry lists are planned: a record with any other id goes to
    Python, which looks it up. A registry that does not answer fails the slice, as it would in Python.
    """
    from onceflow.decoding.schema_registry import SchemaNotFound

    reader = fmt.reader_schema
    if fmt.wire == "plain":
        try:
            return [writer_plan(reader, fmt.writer_schema or reader, None)], []
        except NotPlanned as exc:
            return [], [f"the writer schema: {exc}"]
    if registry is None:  # Python's decoder says what is missing, in the task
        return [], ["no schema registry is named"]
    subjects = [fmt.subject] if fmt.subject is not None else [f"{t}-value" for t in topics]
    listed: dict[int, str] = {}
    for subject in dict.fromkeys(subjects):
        try:
            for version in registry.versions(subject):
                listed[version.id] = version.schema
        except SchemaNotFound:
            continue
    plans, notes = [], []
    for schema_id in sorted(listed)[-MAX_PLANNED_WRITERS:]:
        try:
            plans.append(writer_plan(reader, listed[schema_id], schema_id))
        except NotPlanned as exc:
            notes.append(f"schema id {schema_id}: {exc}")
    return plans, notes


def _record(text: str, which: str) -> Mapping[str, Any]:
    try:
        schema = json.loads(text)
    except ValueError as exc:
        raise NotPlanned(f"the {which} schema is not JSON") from exc
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise NotPlanned(f"the {which} schema is not a record")
    if not isinstance(schema.get("name"), str) or not _NAME.match(schema["name"]):
        raise NotPlanned(f"the {which} record's name is not a simple name")
    if not isinstance(schema.get("namespace", ""), str) or not _NAMESPACE.match(schema.get("namespace", "")):
        raise NotPlanned(f"the {which} record's namespace is not a dotted name")
    if not isinstance(schema.get("fields"), list):
        raise NotPlanned(f"the {which} record has no field list")
    return schema


def _writer_field(field: Any, named: set[tuple[str | None, str]]) -> WriterField:
    name = field.get("name") if isinstance(field, dict) else None
    if not isinstance(name, str) or not _NAME.match(name):
        raise NotPlanned("a field without a simple name")
    avro_type = field.get("type")
    if isinstance(avro_type, list):
        branches = [b for b in avro_type if b != "null"]
        if len(avro_type) != 2 or len(branches) != 1:
            raise NotPlanned(f"field {name!r}: a union other than null and one type")
        return WriterField(name, _type(name, branches[0], named), True, avro_type[0] == "null")
    return WriterField(name, _type(name, avro_type, named), False)


def _type(name: str, avro_type: Any, named: set[tuple[str | None, str]]) -> AvroType:
    if isinstance(avro_type, str):
        if avro_type not in _PRIMITIVES:
            raise NotPlanned(f"field {name!r}: type {avro_type!r} (a named type is decoded in Python)")
        return AvroType(avro_type)
    if not isinstance(avro_type, dict):
        raise NotPlanned(f"field {name!r}: a type spelled neither as a name nor as an object")
    base, logical = avro_type.get("type"), avro_type.get("logicalType")
    if base in ("enum", "fixed"):
        type_name, namespace = avro_type.get("name"), avro_type.get("namespace")
        if not isinstance(type_name, str) or not _NAME.match(type_name):
            raise NotPlanned(f"field {name!r}: a named type without a simple name")
        if namespace is not None and (not isinstance(namespace, str) or not _NAMESPACE.match(namespace)):
            raise NotPlanned(f"field {name!r}: a namespace that is not a dotted name")
        if (namespace, type_name) in named:
            raise NotPlanned(f"field {name!r}: type {type_name!r} is defined twice")
        named.add((namespace, type_name))
        if base == "enum":
            symbols = avro_type.get("symbols")
            if (
                logical is not None
                or not isinstance(symbols, list)
                or not symbols
                or not all(isinstance(s, str) and _NAME.match(s) for s in symbols)
                or len(set(symbols)) != len(symbols)
            ):
                raise NotPlanned(f"field {name!r}: an enum the decoders may read differently")
            return AvroType("enum", name=type_name, namespace=namespace, symbols=tuple(symbols))
        size = avro_type.get("size")
        if type(size) is not int or size < 1:
            raise NotPlanned(f"field {name!r}: a fixed type without a size")
        if logical is None:
            return AvroType("fixed", size=size, name=type_name, namespace=namespace)
        precision, scale = _decimal(name, avro_type)
        if precision > len(str(2 ** (8 * size - 1) - 1)) - 1:
            raise NotPlanned(f"field {name!r}: a decimal's precision beyond its fixed size")
        if size > 8 and precision <= 18:  # spark-avro truncates such a value to a long unchecked
            raise NotPlanned(f"field {name!r}: a fixed decimal of {size} bytes and precision {precision}")
        return AvroType("fixed", "decimal", precision, scale, size, type_name, namespace)
    if base not in _PRIMITIVES:
        raise NotPlanned(f"field {name!r}: type {base!r} (nested types are decoded in Python)")
    if logical is None:
        return AvroType(base)
    if logical == "decimal" and base == "bytes":
        precision, scale = _decimal(name, avro_type)
        return AvroType("bytes", "decimal", precision, scale)
    if (base, logical) not in _LOGICAL:
        raise NotPlanned(f"field {name!r}: logical type {logical!r} over {base!r}")
    return AvroType(base, logical)


def _decimal(name: str, avro_type: Mapping[str, Any]) -> tuple[int, int]:
    precision, scale = avro_type.get("precision"), avro_type.get("scale", 0)
    if type(precision) is not int or type(scale) is not int or not 0 <= scale <= precision <= 38:
        raise NotPlanned(f"field {name!r}: a decimal without 0 <= scale <= precision <= 38")
    if precision < 1:
        raise NotPlanned(f"field {name!r}: a decimal of precision 0")
    return precision, scale


# ------------------------------------------------------------------------------------ the JVM checks


def registry_header(plan: WriterPlan) -> str:
    """The hex of the 5 bytes a record of ``plan`` starts with on the registry wire."""
    assert plan.schema_id is not None
    return f"00{plan.schema_id:08X}"


def decoded_columns(plans: Sequence[WriterPlan], value: Any, plain: bool) -> list[Any]:
    """The first step's columns: ``_body`` and, per plan, ``_d{k}``: the body decoded with plan k's
    writer schema where the record carries its id (null elsewhere, so each body is decoded once)."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    if plain:
        body = value
        matches = [F.lit(True) for _ in plans]
    else:
        body = F.substring(value, 6, 2**31 - 1)
        header = F.hex(F.substring(value, 1, 5))
        matches = [(F.octet_length(value) >= 5) & (header == registry_header(p)) for p in plans]
    columns = [body.alias("_body")]
    for k, (plan, match) in enumerate(zip(plans, matches, strict=True)):
        decoded = from_avro(body, plan.writer_json, {**FROM_AVRO_OPTIONS, "avroSchema": plan.decode_json})
        columns.append(F.when(match, decoded).alias(f"_d{k}"))
    return columns


def decode_checks(plan: WriterPlan, k: int) -> tuple[Any, list[Any]]:
    """Over the first step's columns: whether plan k decoded the record exactly as fastavro would,
    and the reader columns' values (null where the check fails).

    The decoded record, encoded again by spark-avro (``to_avro``, Avro's shortest encoding), must be the
    body itself followed by the sentinel's byte: that one comparison proves the body is one record, in
    the shortest encoding, with boolean bytes of 0 or 1. What a round trip cannot see is checked per
    field (`_value_checks`).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import to_avro

    decoded, body = F.col(f"_d{k}"), F.col("_body")
    proved = decoded[plan.sentinel] == F.lit(True)  # null where the decoder gave up (a null record)
    encoded = F.when(proved, to_avro(decoded, plan.decode_json))  # lazy: a null record is not encoded
    checks = [proved, encoded == F.concat(body, F.unhex(F.lit("01")))]
    for field in plan.fields:
        v = decoded[field.name]
        value_checks = _value_checks(field.type, v)
        checks += [v.isNull() | check for check in value_checks] if field.nullable else value_checks
    values = []
    for column in plan.columns:
        if column.source is None:
            values.append(F.lit(column.default))
            continue
        v = decoded[column.source]
        values.append(v)
        if not column.nullable:
            checks.append(v.isNotNull())
    return plan_all(checks), values


def _value_checks(t: AvroType, v: Any) -> list[Any]:
    """What a value of type ``t`` must hold besides its encoding: Java keeps a string's bytes as they are
    (fastavro refuses invalid UTF-8 and rewrites a uuid's other spellings), and Python's datetimes end
    at years 1 and 9999."""
    from pyspark.sql import functions as F

    if t.logical in ("timestamp-millis", "timestamp-micros"):
        return [F.unix_micros(v).between(*_MICROS_RANGE)]
    if t.logical == "date":
        return [F.unix_date(v).between(*_DAYS_RANGE)]
    if t.base == "string":
        return [F.is_valid_utf8(v), v.rlike(_UUID)] if t.logical == "uuid" else [F.is_valid_utf8(v)]
    return []


def _balanced(items: Sequence[Any], combine: Any) -> Any:
    """``items`` combined pairwise as a balanced tree: a chain of dozens of checks or lengths would
    nest too deep for Spark Connect's plan messages."""
    if len(items) == 1:
        return items[0]
    middle = len(items) // 2
    return combine(_balanced(items[:middle], combine), _balanced(items[middle:], combine))


def plan_all(checks: Sequence[Any]) -> Any:
    """Every check holds (a balanced conjunction)."""
    return _balanced(checks, lambda a, b: a & b)

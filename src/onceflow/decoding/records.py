"""Raw Kafka records, and their decoding into rows or dead letters.

Every input record yields exactly one row or exactly one `DeadLetter`: a record that cannot be decoded is
kept, with its bytes and a reason, instead of disappearing from an epoch that claims to be exactly-once.
Reasons are ``code: detail`` with a short stable code (see `DEAD_LETTER_CODES`) for filtering and counting,
and a detail for the person who has to fix the producer.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from onceflow.decoding.avro_records import AvroDecoder, AvroReject
from onceflow.decoding.schema_registry import SchemaRegistry
from onceflow.decoding.typed_json import typed_decoder
from onceflow.pipeline import AvroFormat, JsonFormat, RecordFormat

Row = dict[str, Any]

DEAD_LETTER_CODES: tuple[str, ...] = (
    "oversized",
    "null_value",
    "not_utf8",
    "malformed_json",
    "not_object",
    "missing_field",
    "wrong_type",
    "missing_key",
    "bad_magic_byte",
    "unknown_schema_id",
    "malformed_avro",
    "incompatible_schema",
    "null_field",
)


class KafkaRecord(NamedTuple):
    """A record as stored in Kafka. ``timestamp`` is in ms, None when the broker has none.

    A named tuple, not a frozen dataclass: the Python reader makes one for every record an epoch reads,
    and a tuple is made in half the time (about 1 µs a record less).
    """

    topic: str
    partition: int
    offset: int
    timestamp: int | None
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()

    @property
    def size(self) -> int:
        """Key plus value bytes: what ``max_record_bytes`` limits."""
        return len(self.key or b"") + len(self.value or b"")


@dataclass(frozen=True)
class DeadLetter:
    """A record that could not become a row, with the reason, and what is kept of its key and value.

    A letter keeps a prefix of the record's bytes (`kept`), and their whole sizes: a flood of large
    poison records must not fill a Spark driver or the ledger, and the record itself stays in Kafka at
    its offset. ``key_size``/``value_size`` are the original sizes (None: kept whole, as written before
    the cap existed).
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None = field(repr=False)
    reason: str
    key_size: int | None = None
    value_size: int | None = None

    @classmethod
    def kept(
        cls,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        reason: str,
        keep_bytes: int,
    ) -> DeadLetter:
        """The letter of a record, keeping at most ``keep_bytes`` of its key and of its value."""
        return cls(
            topic,
            partition,
            offset,
            None if key is None else key[:keep_bytes],
            None if value is None else value[:keep_bytes],
            reason,
            None if key is None else len(key),
            None if value is None else len(value),
        )

    def without_payload(self) -> DeadLetter:
        """The letter with its reason and sizes but no bytes: past a task's payload budget."""
        key_size = self.key_size if self.key_size is not None or self.key is None else len(self.key)
        value_size = self.value_size if self.value_size is not None or self.value is None else len(self.value)
        return replace(self, key=None, value=None, key_size=key_size, value_size=value_size)

    @property
    def code(self) -> str:
        return self.reason.partition(":")[0]

    @property
    def truncated(self) -> bool:
        """Whether the letter keeps less of the value than the record had."""
        return self.value_size is not None and (self.value is None or len(self.value) < self.value_size)

    def to_json(self) -> str:
        """The letter as JSON (bytes in base64), to travel from a Spark task to its driver."""
        return json.dumps(
            {
                "topic": self.topic,
                "partition": self.partition,
                "offset": self.offset,
                "key": None if self.key is None else base64.b64encode(self.key).decode(),
                "value": None if self.value is None else base64.b64encode(self.value).decode(),
                "reason": self.reason,
                "key_size": self.key_size,
                "value_size": self.value_size,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> DeadLetter:
        data = json.loads(text)
        key, value = data["key"], data["value"]
        return cls(
            data["topic"],
            int(data["partition"]),
            int(data["offset"]),
            None if key is None else base64.b64decode(key),
            None if value is None else base64.b64decode(value),
            data["reason"],
            data.get("key_size"),
            data.get("value_size"),
        )


@dataclass
class DecodedBatch:
    """The outcome of decoding a batch: ``len(rows) + len(dead_letters)`` equals the records read."""

    rows: list[Row] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# What one decoder (one Spark task) keeps of its dead letters: a prefix of each key and value, and the
# bytes of its first letters only; every later letter keeps its offset, reason and sizes. So a flood of
# large bad records costs a driver and the ledger at most about 1 MiB of payload per task, and every bad
# record is still accounted for (the record itself stays in Kafka at its offset).
DEAD_LETTER_PREFIX_BYTES = 1024
DEAD_LETTERS_WITH_PAYLOAD = 1000


class _Reject(Exception):
    """Internal: carries a dead-letter reason out of the decoding steps."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.reason = f"{code}: {detail}"


def decode_record(record: KafkaRecord, fmt: RecordFormat, max_record_bytes: int) -> Row | DeadLetter:
    """One row (the format's columns plus `onceflow.pipeline.METADATA_COLUMNS`) or one dead letter."""
    return RowDecoder(fmt, max_record_bytes).decode_row(record)


def decode_records(records: Iterable[KafkaRecord], fmt: RecordFormat, max_record_bytes: int) -> DecodedBatch:
    decoder = RowDecoder(fmt, max_record_bytes)
    batch = DecodedBatch()
    for record in records:
        decoded = decoder.decode_row(record)
        if isinstance(decoded, DeadLetter):
            batch.dead_letters.append(decoded)
        else:
            batch.rows.append(decoded)
    return batch


def _check_surrogates(fields: tuple[tuple[str, str, bool, type[Any]], ...], values: list[Any]) -> None:
    """Refuse a string that holds an unpaired surrogate (``"\\ud800"`` is valid JSON): it has no UTF-8
    form, so every writer would fail on it, and the task with it on every replay."""
    for (name, _, _, _), value in zip(fields, values, strict=False):
        if type(value) is str:
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise _Reject(
                    "not_utf8", f"field {name!r} holds an unpaired surrogate escape, which has no UTF-8 form"
                ) from exc


class RowDecoder:
    """Decodes the records of one format into row tuples (in `row_columns` order) or dead letters.

    Built once per format and task, so that the per-record path, which runs for every record an epoch
    reads, does no schema look-ups. A JSON record goes first to the format's typed decoder
    (`onceflow.decoding.typed_json`), which parses and checks it in one call; what that one does not accept
    takes the exact path, where each field's accepted Python type is resolved here and only a value that
    fails the fast type test goes through `_convert` for its precise reason.
    """

    def __init__(
        self, fmt: RecordFormat, max_record_bytes: int, registry: SchemaRegistry | None = None
    ) -> None:
        self.fmt = fmt
        self.max_record_bytes = max_record_bytes
        self.columns: tuple[str, ...] = tuple(name for name, _, _ in row_columns(fmt))
        self._fields: tuple[tuple[str, str, bool, type[Any]], ...] = (
            tuple(
                (name, base, nullable, _PYTHON_TYPES[base])
                for name in fmt.schema
                for base, nullable in [fmt.field_type(name)]
            )
            if isinstance(fmt, JsonFormat)
            else ()
        )
        self._key_field = fmt.key_field if isinstance(fmt, JsonFormat | AvroFormat) else None
        # Most records are settled by one typed parse; the rest by the exact path below it.
        self._typed = (
            typed_decoder([(name, base, nullable) for name, base, nullable, _ in self._fields])
            if isinstance(fmt, JsonFormat)
            else None
        )
        # Avro values go to fastavro; ``registry`` resolves writer schema ids (wire="registry").
        self._avro = AvroDecoder(fmt, registry) if isinstance(fmt, AvroFormat) else None
        self.dead_letters = 0  # letters made so far: past DEAD_LETTERS_WITH_PAYLOAD they keep no bytes

    def decode_row(self, record: KafkaRecord) -> Row | DeadLetter:
        """`decode`, with the row as a dict of column to value."""
        decoded = self.decode(record)
        return decoded if isinstance(decoded, DeadLetter) else dict(zip(self.columns, decoded, strict=True))

    def decode(self, record: KafkaRecord) -> tuple[Any, ...] | DeadLetter:
        if self._typed is not None:
            row = self._typed_row(self._typed, record)
            if row is not None:
                return row
        try:
            if record.size > self.max_record_bytes:
                raise _Reject(
                    "oversized", f"{record.size} bytes of key and value, limit {self.max_record_bytes}"
                )
            values: list[Any]
            if isinstance(self.fmt, JsonFormat):
                values = self._json_values(record)
            elif self._avro is not None:
                values = self._avro_values(self._avro, record)
            else:
                values = [record.key, record.value]
        except (_Reject, AvroReject) as rejected:
            self.dead_letters += 1
            letter = DeadLetter.kept(
                record.topic,
                record.partition,
                record.offset,
                record.key,
                record.value,
                rejected.reason,
                DEAD_LETTER_PREFIX_BYTES,
            )
            return letter if self.dead_letters <= DEAD_LETTERS_WITH_PAYLOAD else letter.without_payload()
        values += (record.topic, record.partition, record.offset, record.timestamp)
        return tuple(values)

    def _typed_row(
        self, typed: Callable[[str], tuple[Any, ...] | None], record: KafkaRecord
    ) -> tuple[Any, ...] | None:
        """The row of a JSON record that the typed decoder accepts as it stands, in one pass; None
        sends the record down the exact path, which has the reason for every dead letter."""
        value, key = record.value, record.key
        if value is None or record.size > self.max_record_bytes:
            return None
        try:
            values = typed(value.decode("utf-8"))
            if values is None:
                return None
            if self._key_field is None:
                return (*values, record.topic, record.partition, record.offset, record.timestamp)
            if key is None:
                return None
            return (
                *values,
                key.decode("utf-8"),
                record.topic,
                record.partition,
                record.offset,
                record.timestamp,
            )
        except UnicodeDecodeError:
            return None

    def _json_values(self, record: KafkaRecord) -> list[Any]:
        if record.value is None:
            raise _Reject("null_value", "record has no value (a tombstone?)")
        text = _utf8(record.value, "value")
        try:
            document: Any = _json_document(text)
        except ValueError as exc:
            raise _Reject("malformed_json", str(exc)) from exc
        except RecursionError as exc:
            raise _Reject("malformed_json", "nested too deeply to decode") from exc
        if type(document) is not dict:
            raise _Reject("not_object", f"expected a JSON object, found {_json_type(document)}")
        values: list[Any] = []
        for name, base, nullable, python_type in self._fields:
            value: Any = document.get(name)
            if type(value) is python_type and (python_type is not int or _INT64_MIN <= value <= _INT64_MAX):
                values.append(value)
            elif value is None:
                if not nullable:
                    if name not in document:
                        raise _Reject("missing_field", f"field {name!r} ({base}) is missing")
                    raise _Reject("wrong_type", f"field {name!r}: expected {base}, found null")
                values.append(None)
            else:
                values.append(_convert(name, value, base))
        # An escaped surrogate: is every string still UTF-8? (Most records have no escape at all.)
        if "\\u" in text and ("\\ud" in text or "\\uD" in text):
            _check_surrogates(self._fields, values)
        return self._with_key(values, record)

    def _with_key(self, values: list[Any], record: KafkaRecord) -> list[Any]:
        """``values`` with the key's column appended, where the format declares one."""
        if self._key_field is not None:
            if record.key is None:
                raise _Reject("missing_key", f"the format needs a key for column {self._key_field!r}")
            values.append(_utf8(record.key, "key"))
        return values

    def _avro_values(self, avro: AvroDecoder, record: KafkaRecord) -> list[Any]:
        if record.value is None:
            raise _Reject("null_value", "record has no value (a tombstone?)")
        return self._with_key(avro.values(record.value), record)


_PYTHON_TYPES: dict[str, type[Any]] = {"string": str, "int": int, "float": float, "bool": bool}


def _utf8(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Reject("not_utf8", f"{what}: {exc.reason} at byte {exc.start}") from exc


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# One decoder for every record: json.loads with an argument would build a new one per call.
_JSON = json.JSONDecoder(parse_constant=_reject_constant)
_SCAN = _JSON.scan_once  # type: ignore[attr-defined]  # set by JSONDecoder.__init__; not in the stubs


def _json_document(text: str) -> Any:
    """``_JSON.decode(text)``, the scanner alone where the text is one value with nothing around it. The
    decoder matches a whitespace pattern before and after the value, which took a third as long as
    the parse itself for a 200-byte record. Anything else (whitespace around the value, extra data, no
    value) goes to the decoder, so that the answer and its error message are the module's own."""
    try:
        document, end = _SCAN(text, 0)
    except StopIteration:
        return _JSON.decode(text)
    return document if end == len(text) else _JSON.decode(text)


def _convert(name: str, value: Any, expected: str) -> Any:
    """A value whose type is not exactly the expected one: converted where JSON allows (int as float),
    otherwise the `_Reject` that says what was found."""
    found = _json_type(value)
    if expected == "int" and found == "int":
        raise _Reject("wrong_type", f"field {name!r}: expected int, found {value} beyond 64 bits")
    if expected == "float" and found == "int":
        try:
            return float(value)
        except OverflowError as exc:
            raise _Reject(
                "wrong_type", f"field {name!r}: expected float, found an int beyond its range"
            ) from exc
    raise _Reject("wrong_type", f"field {name!r}: expected {expected}, found {found}")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def row_columns(fmt: RecordFormat) -> list[tuple[str, str, bool]]:
    """(name, type, nullable) of the rows `decode_record` yields for ``fmt``, in order.

    Types are the schema's ("string", "int", "float", "bool") plus "bytes" for raw keys and values, and
    for Avro "bytes", "timestamp" (UTC, microseconds), "date" and "decimal(p,s)" (`onceflow.avro_schema`).
    """
    columns: list[tuple[str, str, bool]] = []
    if isinstance(fmt, JsonFormat):
        for name in fmt.schema:
            expected, nullable = fmt.field_type(name)
            columns.append((name, expected, nullable))
        if fmt.key_field is not None:
            columns.append((fmt.key_field, "string", False))
    elif isinstance(fmt, AvroFormat):
        columns += fmt.columns()
        if fmt.key_field is not None:
            columns.append((fmt.key_field, "string", False))
    else:
        columns += [("key", "bytes", True), ("value", "bytes", True)]
    return [
        *columns,
        ("_topic", "string", False),
        ("_partition", "int32", False),
        ("_offset", "int", False),
        ("_timestamp", "int", True),
    ]


def spark_schema(fmt: RecordFormat) -> Any:
    """The Spark StructType of the rows `decode_record` yields for ``fmt`` (imports PySpark lazily)."""
    from pyspark.sql import types as T

    spark_types = {
        "string": T.StringType(),
        "int": T.LongType(),
        "int32": T.IntegerType(),
        "float": T.DoubleType(),
        "bool": T.BooleanType(),
        "bytes": T.BinaryType(),
        "timestamp": T.TimestampType(),
        "date": T.DateType(),
    }
    return T.StructType(
        [T.StructField(n, _spark_type(T, spark_types, t), nullable) for n, t, nullable in row_columns(fmt)]
    )


def _spark_type(T: Any, simple: dict[str, Any], type_name: str) -> Any:
    if type_name.startswith("decimal("):
        precision, scale = decimal_parts(type_name)
        return T.DecimalType(precision, scale)
    return simple[type_name]


def decimal_parts(type_name: str) -> tuple[int, int]:
    """(precision, scale) of a row type ``decimal(p,s)``."""
    precision, _, scale = type_name.removeprefix("decimal(").removesuffix(")").partition(",")
    return int(precision), int(scale)

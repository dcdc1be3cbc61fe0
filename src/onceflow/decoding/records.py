"""Raw Kafka records, and their decoding into rows or dead letters.

Every input record yields exactly one row or exactly one `DeadLetter`: a record that cannot be decoded is
kept, with its bytes and a reason, instead of disappearing from an epoch that claims to be exactly-once.
Reasons are ``code: detail`` with a short stable code (see `DEAD_LETTER_CODES`) for filtering and counting,
and a detail for the person who has to fix the producer.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, NamedTuple

from onceflow.decoding.avro_records import AvroDecoder, AvroReject
from onceflow.decoding.debezium import (
    OPS,
    Change,
    ChangeRejected,
    DecimalHandling,
    read_json_change,
    unscaled_decimal,
)
from onceflow.decoding.schema_registry import SchemaRegistry
from onceflow.decoding.typed_json import handles, typed_decoder
from onceflow.pipeline import OP_COLUMN, AvroFormat, Debezium, JsonFormat, RecordFormat
from onceflow.schemas.types import (
    Array,
    DecimalType,
    Map,
    Primitive,
    SchemaType,
    Struct,
    field_path,
    key_path,
    parse_type,
    primitive_names,
    render,
    row_type,
    with_nullable,
)

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
        """The letter of a record, keeping at most ``keep_bytes`` of its key and of its value, and
        `REASON_CHARS` of its reason."""
        return cls(
            topic,
            partition,
            offset,
            None if key is None else key[:keep_bytes],
            None if value is None else value[:keep_bytes],
            capped_reason(reason),
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
# The most characters of a dead letter's reason: a reason quotes the value or the field it is about (a
# 4,000-digit integer, an Avro name of any length), which the kept bytes already hold.
REASON_CHARS = 200


def capped_reason(reason: str) -> str:
    """``reason`` cut to `REASON_CHARS`, its ``code:`` prefix kept and the cut marked with an ellipsis."""
    return reason if len(reason) <= REASON_CHARS else reason[: REASON_CHARS - 1] + "…"


class _Reject(Exception):
    """Internal: carries a dead-letter reason out of the decoding steps."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.reason = f"{code}: {detail}"


def _read_value(path: str, value: Any, t: SchemaType) -> Any:
    """One parsed JSON value as a row holds a ``t`` (null where ``t`` allows it); `_Reject`, naming
    ``path``, where it does not fit (a change event's image is read by it)."""
    return value if _as_it_stands(value, t) else _value_at(path, value, t)


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


# One field of a JSON format, as the exact path reads it: (name, base type text, nullable, the Python
# type a value takes as it stands, the non-null type tree).
_Field = tuple[str, str, bool, type[Any], SchemaType]


def _check_surrogates(fields: tuple[_Field, ...], values: list[Any]) -> None:
    """Refuse a string that holds an unpaired surrogate (``"\\ud800"`` is valid JSON): it has no UTF-8
    form, so every writer would fail on it, and the task with it on every replay. Nested values are
    walked to their strings and map keys, each named by its path."""
    for (name, _, _, _, kind), value in zip(fields, values, strict=False):
        _check_strings(name, value, kind)


def _check_strings(path: str, value: Any, t: SchemaType) -> None:
    if value is None:
        return
    if type(value) is str:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _Reject(
                "not_utf8", f"field {path!r} holds an unpaired surrogate escape, which has no UTF-8 form"
            ) from exc
    elif isinstance(t, Struct):
        for name, inner in t.fields:
            _check_strings(field_path(path, name), value[name], inner)
    elif isinstance(t, Array):
        for index, item in enumerate(value):
            _check_strings(f"{path}[{index}]", item, t.element)
    elif isinstance(t, Map):
        for key, item in value.items():
            try:
                key.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise _Reject(
                    "not_utf8",
                    f"field {path!r} has a key with an unpaired surrogate escape, which has no UTF-8 form",
                ) from exc
            _check_strings(key_path(path, key), item, t.value)


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
        self._fields: tuple[_Field, ...] = (
            tuple(
                (name, base, nullable, _PYTHON_TYPES.get(base, _Unmatched), parse_type(base))
                for name in fmt.schema
                for base, nullable in [fmt.field_type(name)]
            )
            if isinstance(fmt, JsonFormat)
            else ()
        )
        self._key_field = fmt.key_field if isinstance(fmt, JsonFormat | AvroFormat) else None
        self._changes = fmt.changes if isinstance(fmt, JsonFormat) else None
        self._change_fields = tuple(
            (name, with_nullable(kind, nullable)) for name, _, nullable, _, kind in self._fields
        )
        # Most records are settled by one typed parse; the rest by the exact path below it. A format
        # with a type the typed decoder cannot prove equal (time, decimal, ...) takes the exact path.
        self._typed = (
            typed_decoder([(name, base, nullable) for name, base, nullable, _, _ in self._fields])
            if isinstance(fmt, JsonFormat)
            and fmt.changes is None
            and all(handles(kind) for *_, kind in self._fields)
            else None
        )
        # A decimal must not pass through a double: such a format parses JSON fractions as Decimal.
        exact_numbers = any("decimal" in primitive_names(kind) for *_, kind in self._fields)
        self._json = _JSON_DECIMAL if exact_numbers else _JSON
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
            if self._changes is not None:
                values = self._change_values(self._changes, record)
            elif isinstance(self.fmt, JsonFormat):
                values = self._json_values(record)
            elif self._avro is not None:
                values = self._avro_values(self._avro, record)
            else:
                values = [record.key, record.value]
        except (_Reject, AvroReject, ChangeRejected) as rejected:
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
            document: Any = _json_document(text, self._json)
        except ValueError as exc:
            raise _Reject("malformed_json", str(exc)) from exc
        except RecursionError as exc:
            raise _Reject("malformed_json", "nested too deeply to decode") from exc
        if type(document) is not dict:
            raise _Reject("not_object", f"expected a JSON object, found {_json_type(document)}")
        values: list[Any] = []
        for name, base, nullable, python_type, kind in self._fields:
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
                values.append(_convert(name, value, kind))
        # An escaped surrogate: is every string still UTF-8? (Most records have no escape at all.)
        if "\\u" in text and ("\\ud" in text or "\\uD" in text):
            _check_surrogates(self._fields, values)
        return self._with_key(values, record)

    def _change_values(self, changes: Debezium, record: KafkaRecord) -> list[Any]:
        """A change event's row (`onceflow.decoding.debezium`): the schema's fields, then its op."""
        change = read_json_change(record.key, record.value)
        decimals: DecimalHandling = "string" if changes.decimals == "string" else "precise"
        row = change_row(change, self._change_fields, changes.key, decimals)
        return [*(row[name] for name, _ in self._change_fields), row[OP_COLUMN]]

    def _with_key(self, values: list[Any], record: KafkaRecord) -> list[Any]:
        """``values`` with the key's column appended, where the format declares one."""
        if self._key_field is not None:
            if record.key is None:
                raise _Reject("missing_key", f"the format needs a key for column {self._key_field!r}")
            values.append(_utf8(record.key, "key"))
        return values

    def _avro_values(self, avro: AvroDecoder, record: KafkaRecord) -> list[Any]:
        if avro.changes is not None:
            return avro.change_values(record.key, record.value)
        if record.value is None:
            raise _Reject("null_value", "record has no value (a tombstone?)")
        return self._with_key(avro.values(record.value), record)


_PYTHON_TYPES: dict[str, type[Any]] = {"string": str, "int": int, "float": float, "bool": bool}


class _Unmatched:
    """The "Python type" of a field whose values always need converting (time, decimal, nested, ...):
    no JSON value has it, so such a field always goes to `_convert`."""


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
# For formats with a decimal: fractions as the exact Decimal of their text (a double field converts it,
# to the same double `float(text)` gives).
_JSON_DECIMAL = json.JSONDecoder(parse_constant=_reject_constant, parse_float=Decimal)


def _json_document(text: str, decoder: json.JSONDecoder = _JSON) -> Any:
    """``decoder.decode(text)``, the scanner alone where the text is one value with nothing around it.
    The decoder matches a whitespace pattern before and after the value, which took a third as long as
    the parse itself for a 200-byte record. Anything else (whitespace around the value, extra data, no
    value) goes to the decoder, so that the answer and its error message are the module's own."""
    scan = _SCAN if decoder is _JSON else decoder.scan_once  # type: ignore[attr-defined]
    try:
        document, end = scan(text, 0)
    except StopIteration:
        return decoder.decode(text)
    return document if end == len(text) else decoder.decode(text)


def _convert(path: str, value: Any, t: SchemaType) -> Any:
    """A non-null value whose type is not exactly the expected one's Python type, as the row holds it:
    converted where the type allows (an int as a float, a text as a date, an object as a struct, ...),
    otherwise the `_Reject` that says what was found, at the field's path (``items[3].qty``,
    ``attrs["colour"]``). The type's own nullability is ignored: the caller has settled null."""
    if isinstance(t, Primitive):
        return _PRIMITIVE_CONVERTERS[t.name](path, value)
    if isinstance(t, DecimalType):
        return _decimal(path, value, t)
    if isinstance(t, Struct):
        return _struct(path, value, t)
    if isinstance(t, Array):
        return _array(path, value, t)
    return _map(path, value, t)


def _wrong(path: str, t: SchemaType | str, found: str) -> _Reject:
    expected = t if isinstance(t, str) else render(with_nullable(t, False))
    return _Reject("wrong_type", f"field {path!r}: expected {expected}, found {found}")


def _as_it_stands(item: Any, t: SchemaType) -> bool:
    """Whether ``item`` is already the row's value for ``t`` (a string, an int within 64 bits, ...), so
    that the common values inside nested data need no path and no conversion."""
    python_type = _PYTHON_TYPES.get(t.name) if type(t) is Primitive else None
    return (
        python_type is not None
        and type(item) is python_type
        and (python_type is not int or _INT64_MIN <= item <= _INT64_MAX)
    )


def _value_at(path: str, item: Any, t: SchemaType) -> Any:
    """A value inside a struct, array or map that is not as it stands: null where ``t`` allows it,
    else converted (or refused, naming ``path``)."""
    if item is None:
        if not t.nullable:
            raise _wrong(path, t, "null")
        return None
    return _convert(path, item, t)


def _struct(path: str, value: Any, t: Struct) -> dict[str, Any]:
    if type(value) is not dict:
        raise _wrong(path, t, _json_type(value))
    out: dict[str, Any] = {}
    for name, inner in t.fields:
        item = value.get(name)
        if _as_it_stands(item, inner):
            out[name] = item
        elif item is None and not inner.nullable and name not in value:
            where, declared = field_path(path, name), render(with_nullable(inner, False))
            raise _Reject("missing_field", f"field {where!r} ({declared}) is missing")
        else:
            out[name] = _value_at(field_path(path, name), item, inner)
    return out


def _array(path: str, value: Any, t: Array) -> list[Any]:
    if type(value) is not list:
        raise _wrong(path, t, _json_type(value))
    element = t.element
    return [
        item if _as_it_stands(item, element) else _value_at(f"{path}[{index}]", item, element)
        for index, item in enumerate(value)
    ]


def _map(path: str, value: Any, t: Map) -> dict[str, Any]:
    if type(value) is not dict:
        raise _wrong(path, t, _json_type(value))
    inner = t.value
    return {
        key: item if _as_it_stands(item, inner) else _value_at(key_path(path, key), item, inner)
        for key, item in value.items()
    }


def _string(path: str, value: Any) -> str:
    if type(value) is str:
        return value
    raise _wrong(path, "string", _json_type(value))


def _int(path: str, value: Any) -> int:
    if type(value) is int:
        if _INT64_MIN <= value <= _INT64_MAX:
            return value
        raise _wrong(path, "int", f"{value} beyond 64 bits")
    raise _wrong(path, "int", _json_type(value))


def _float(path: str, value: Any) -> float:
    if type(value) is float:
        return value
    if type(value) is int or type(value) is Decimal:  # Decimal: a fraction, in a format with decimals
        try:
            return float(value)
        except OverflowError as exc:
            raise _wrong(path, "float", "an int beyond its range") from exc
    raise _wrong(path, "float", _json_type(value))


def _bool(path: str, value: Any) -> bool:
    if type(value) is bool:
        return value
    raise _wrong(path, "bool", _json_type(value))


def _bytes(path: str, value: Any) -> bytes:
    if type(value) is not str:
        raise _wrong(path, "bytes", _json_type(value))
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _wrong(path, "bytes", "text that is not base64") from exc


_DATE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
_TIMESTAMP = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]+))?)?"
    r"(?:([Zz])|([+-])([0-9]{2}):?([0-9]{2}))?"
)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _date(path: str, value: Any) -> dt.date:
    if type(value) is not str:
        raise _wrong(path, "date", _json_type(value))
    found = _DATE.fullmatch(value)
    if found is None:
        raise _wrong(path, "date", "text that is not an ISO date YYYY-MM-DD")
    try:
        return dt.date(int(found[1]), int(found[2]), int(found[3]))
    except ValueError as exc:
        raise _wrong(path, "date", "a date that does not exist") from exc


def _timestamp(path: str, value: Any) -> dt.datetime:
    """ISO-8601 text with its UTC offset (or ``Z``), to microseconds: a time without an offset could
    be any instant, and digits past the microsecond would be lost, so both are refused, not guessed."""
    if type(value) is not str:
        raise _wrong(path, "timestamp", _json_type(value))
    found = _TIMESTAMP.fullmatch(value)
    if found is None:
        raise _wrong(path, "timestamp", "text that is not an ISO-8601 timestamp")
    year, month, day, hour, minute, second, fraction, zulu, sign, off_h, off_m = found.groups()
    if zulu is None and sign is None:
        raise _wrong(path, "timestamp", "text without a UTC offset (it needs Z or +HH:MM)")
    fraction = fraction or ""
    if fraction[6:].strip("0"):
        raise _wrong(path, "timestamp", "digits past the microsecond")
    try:
        offset = dt.timedelta(hours=int(off_h or 0), minutes=int(off_m or 0))
        zone = dt.timezone(-offset if sign == "-" else offset)
        at = dt.datetime(
            int(year),
            int(month),
            int(day),
            int(hour),
            int(minute),
            int(second or 0),
            int(fraction[:6].ljust(6, "0")),
            tzinfo=zone,
        )
    except ValueError as exc:
        raise _wrong(path, "timestamp", "a date, time or offset that does not exist") from exc
    try:
        return at.astimezone(dt.UTC)
    except OverflowError as exc:
        raise _wrong(path, "timestamp", "an instant beyond years 1-9999 in UTC") from exc


def _epoch(unit: str, per_unit: int) -> Callable[[str, Any], dt.datetime]:
    def convert(path: str, value: Any) -> dt.datetime:
        if type(value) is not int:
            raise _wrong(path, unit, _json_type(value))
        try:
            return _EPOCH + dt.timedelta(microseconds=value * per_unit)
        except OverflowError as exc:
            raise _wrong(path, unit, "an int beyond years 1-9999") from exc

    return convert


def _json_text(path: str, value: Any) -> str:
    """Any JSON value as its canonical text (sorted keys, no spaces, UTF-8 as it is)."""
    try:
        return json.dumps(
            value,
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
            default=_plain_number,
        )
    except ValueError as exc:  # 1e400 reads as an infinity, which JSON text cannot hold
        raise _wrong(path, "json", "a number beyond the double range") from exc
    except RecursionError as exc:
        raise _wrong(path, "json", "a value nested too deeply to write") from exc


def _plain_number(value: Any) -> Any:
    """A Decimal (a fraction read by a format with decimals) as the double a json value holds."""
    if type(value) is Decimal:
        return float(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


_DECIMAL_TEXT = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


def _decimal(path: str, value: Any, t: DecimalType) -> Decimal:
    """A JSON number or numeric text as a decimal of ``t``'s scale, exactly. A value that needs more
    digits after the point than the scale, or more before it than precision - scale, is refused, not
    rounded: rounding would change an amount without anyone seeing it."""
    numeric = type(value) is int or type(value) is Decimal
    if numeric or (type(value) is str and _DECIMAL_TEXT.fullmatch(value)):
        number = Decimal(value)
    elif type(value) is str:
        raise _wrong(path, t, "text that is not a number")
    else:
        raise _wrong(path, t, _json_type(value))
    sign, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)  # finite: the JSON grammar and the pattern have no NaN
    significant = len(digits)
    while significant > 1 and digits[significant - 1] == 0:
        significant -= 1
    exponent += len(digits) - significant
    digits = digits[:significant]
    if digits == (0,):
        return Decimal((0, (0,), -t.scale))
    after_point = max(0, -exponent)
    if after_point > t.scale:
        raise _wrong(path, t, f"a number with {after_point} digits after the point")
    before_point = max(0, len(digits) + exponent)
    if before_point > t.precision - t.scale:
        raise _wrong(path, t, f"a number with {before_point} digits before the point")
    return Decimal((sign, digits + (0,) * (exponent + t.scale), -t.scale))


_PRIMITIVE_CONVERTERS: dict[str, Callable[[str, Any], Any]] = {
    "string": _string,
    "int": _int,
    "int32": _int,
    "float": _float,
    "bool": _bool,
    "bytes": _bytes,
    "date": _date,
    "timestamp": _timestamp,
    "timestamp_ms": _epoch("timestamp_ms", 1000),
    "timestamp_us": _epoch("timestamp_us", 1),
    "json": _json_text,
}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float | Decimal):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def row_columns(fmt: RecordFormat) -> list[tuple[str, str, bool]]:
    """(name, type, nullable) of the rows `decode_record` yields for ``fmt``, in order.

    Types are canonical texts of `onceflow.schemas.types`: the schema's (JSON's epoch spellings
    ``timestamp_ms``/``timestamp_us`` as "timestamp"), or the reader schema's (`onceflow.schemas.avro`),
    "bytes" for raw keys and values, and "int32" for the partition. A nested column's text holds its
    fields' and elements' own nullability, e.g. ``array<struct<sku:string,qty:int?>>``.
    """
    columns: list[tuple[str, str, bool]] = []
    if isinstance(fmt, JsonFormat):
        changes = fmt.changes
        for name in fmt.schema:
            expected, nullable = fmt.field_type(name)
            if changes is not None and name not in changes.key:
                nullable = True  # a delete's row holds its key and nulls
            columns.append((name, render(row_type(parse_type(expected))), nullable))
        if fmt.key_field is not None:
            columns.append((fmt.key_field, "string", False))
        if changes is not None:
            columns.append((OP_COLUMN, "string", False))
    elif isinstance(fmt, AvroFormat):
        if fmt.changes is not None:  # a delete's row holds its key and nulls
            keys = fmt.changes.key
            columns += [(name, text, nullable or name not in keys) for name, text, nullable in fmt.columns()]
            columns.append((OP_COLUMN, "string", False))
        else:
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
    """The Spark StructType of the rows `decode_record` yields for ``fmt`` (imports PySpark lazily):
    nested types with each field's, element's and value's nullability, so that
    ``spark.createDataFrame(rows, spark_schema(fmt))`` takes the decoded rows as they are."""
    from pyspark.sql import types as T

    return T.StructType(
        [
            T.StructField(name, spark_type(parse_type(text)), nullable)
            for name, text, nullable in row_columns(fmt)
        ]
    )


def spark_type(t: SchemaType) -> Any:
    """The Spark type of a row type (its own nullability is the caller's: a field's or an element's)."""
    from pyspark.sql import types as T

    if isinstance(t, Primitive):
        simple = {
            "string": T.StringType,
            "int": T.LongType,
            "int32": T.IntegerType,
            "float": T.DoubleType,
            "bool": T.BooleanType,
            "bytes": T.BinaryType,
            "timestamp": T.TimestampType,
            "timestamp_ms": T.TimestampType,
            "timestamp_us": T.TimestampType,
            "date": T.DateType,
            "json": T.StringType,  # canonical JSON text
        }
        return simple[t.name]()
    if isinstance(t, DecimalType):
        return T.DecimalType(t.precision, t.scale)
    if isinstance(t, Struct):
        return T.StructType([T.StructField(n, spark_type(f), f.nullable) for n, f in t.fields])
    if isinstance(t, Array):
        return T.ArrayType(spark_type(t.element), containsNull=t.element.nullable)
    return T.MapType(T.StringType(), spark_type(t.value), valueContainsNull=t.value.nullable)


def decimal_parts(type_name: str) -> tuple[int, int]:
    """(precision, scale) of a row type ``decimal(p,s)``."""
    precision, _, scale = type_name.removeprefix("decimal(").removesuffix(")").partition(",")
    return int(precision), int(scale)


def change_row(
    change: Change,
    fields: tuple[tuple[str, SchemaType], ...],
    key_fields: tuple[str, ...] = (),
    decimals: DecimalHandling = "precise",
) -> dict[str, Any]:
    """The row ``change`` writes, read by the declared ``fields`` (name, type), with its op as ``_op``.

    An upsert's row is its ``after`` image; a delete's holds the key (from its ``before`` image, else
    from the record key) and nulls; a truncate's is all nulls. The key is ``key_fields`` or else the
    record key's fields; a change without a value for each of them is refused (``missing_key``).
    """
    keys = key_fields or tuple(change.key or ())
    row: dict[str, Any] = dict.fromkeys((name for name, _ in fields), None)
    try:
        if change.op == "t":
            row["_op"] = "t"
            return row
        if not keys:
            raise ChangeRejected(
                "missing_key", f"a {OPS[change.op]} without a record key, and no key fields are named"
            )
        if change.upsert:
            image = change.image or {}
            for name, t in fields:
                row[name] = _read_value(name, _declared_decimal(image.get(name), t, decimals), t)
        else:
            images = [i for i in (change.image, change.key) if i is not None]
            for name, t in fields:
                if name in keys:
                    found = next((i[name] for i in images if i.get(name) is not None), None)
                    row[name] = (
                        None if found is None else _read_value(name, _declared_decimal(found, t, decimals), t)
                    )
    except _Reject as exc:
        raise ChangeRejected(*exc.reason.split(": ", 1)) from exc
    missing = [name for name in keys if row.get(name) is None]
    if missing:
        raise ChangeRejected("missing_key", f"a {OPS[change.op]} without a value for key field(s) {missing}")
    row["_op"] = change.op
    return row


def _declared_decimal(value: Any, t: SchemaType, decimals: DecimalHandling) -> Any:
    """Without a schema in the event, a ``decimal(p,s)`` field's text is base64 of the unscaled value
    when Debezium's ``decimal.handling.mode`` is ``precise``."""
    if decimals == "precise" and isinstance(value, str) and isinstance(t, DecimalType):
        return unscaled_decimal(value, t.scale)
    return value

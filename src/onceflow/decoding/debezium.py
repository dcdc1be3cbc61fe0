"""Debezium's change events in JSON, read into one change each: what happened, to which key, with
which row.

Debezium writes one event per changed row: ``{"before", "after", "source", "op", "ts_ms", ...}``, with
``op`` one of ``c`` (insert), ``u`` (update), ``d`` (delete), ``r`` (a row of the initial snapshot)
and ``t`` (a truncate), and after each delete a tombstone (the key, and a null value) for Kafka's log
compaction. Its JSON converter writes the event either bare or wrapped with its Connect schema
(``{"schema": ..., "payload": event}``); both are read here, the wrapper recognised per record. The
record key is the table's primary key, bare or wrapped the same way.

The row is the image the change leaves: ``after`` for ``c``/``u``/``r``; for a delete only the key
matters, so the row holds the key's fields and nulls. Values are then read by the pipeline's declared
types (`onceflow.decoding.records`), with Connect's encodings of some types undone first:

* with the schema wrapper, the schema says what a value is: Connect's ``Decimal`` (base64 of the
  unscaled big-endian integer, the scale in the schema) and Debezium's variable-scale decimal become
  exact decimals; ``io.debezium.time.Date`` (days), ``Timestamp`` (ms), ``MicroTimestamp`` (µs) and
  ``NanoTimestamp`` (ns), all without a zone, become ISO text in UTC. ``ZonedTimestamp`` is ISO text
  already;
* without it, the declared type decides: a ``decimal(p,s)`` field's text is base64 when Debezium's
  ``decimal.handling.mode`` is ``precise`` (its default; `DecimalHandling`), numeric text when it is
  ``string``.

A record that is not such an event is refused with its reason: ``malformed_change`` (no ``op``, an
unknown one, no ``after`` where the op needs it), ``missing_key`` (a delete or tombstone whose key is
not there). The row itself is read by `onceflow.decoding.records.change_row`. Nothing here imports
Spark, the ledger or the coordinator.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

OPS: Mapping[str, str] = {"c": "insert", "u": "update", "r": "snapshot", "d": "delete", "t": "truncate"}
# The ops whose row is the ``after`` image (an upsert of the key).
UPSERTS = frozenset({"c", "u", "r"})
DecimalHandling = Literal["precise", "string"]
_CONNECT_DECIMAL = "org.apache.kafka.connect.data.Decimal"
_VARIABLE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
# Debezium's zone-less time types: per unit, the timedelta of one unit.
_LOCAL_TIMESTAMPS: Mapping[str, dt.timedelta] = {
    "io.debezium.time.Timestamp": dt.timedelta(milliseconds=1),
    "io.debezium.time.MicroTimestamp": dt.timedelta(microseconds=1),
}


class ChangeRejected(Exception):
    """A record that is not a change event this reader can apply: its dead-letter reason."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.reason = f"{code}: {detail}"


@dataclass(frozen=True)
class Change:
    """One change: ``op`` (a key of `OPS`), the row image it leaves (``after``; for a delete, the
    ``before`` image if the event has one), the record key's fields, and the source transaction."""

    op: str
    image: Mapping[str, Any] | None
    key: Mapping[str, Any] | None
    transaction: str | None = None

    @property
    def upsert(self) -> bool:
        return self.op in UPSERTS


def _document(data: bytes, what: str) -> Any:
    try:
        return json.loads(data, parse_float=Decimal)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ChangeRejected("malformed_change", f"the {what} is not JSON ({exc})") from exc


def _unwrap(document: Any) -> tuple[Any, Mapping[str, Any] | None]:
    """(payload, Connect schema) of a JSON converter's output, wrapped with its schema or bare."""
    if isinstance(document, dict) and set(document) == {"schema", "payload"}:
        schema = document["schema"]
        return document["payload"], schema if isinstance(schema, dict) else None
    return document, None


def read_json_change(key: bytes | None, value: bytes | None) -> Change:
    """The change a Debezium JSON event (or tombstone) holds, values as the converter wrote them, with
    Connect's encodings undone where the event carries its schema."""
    key_fields: Mapping[str, Any] | None = None
    if key is not None:
        payload, schema = _unwrap(_document(key, "key"))
        if isinstance(payload, dict):
            key_fields = _restored(payload, schema)
    if value is None:  # a tombstone: the key was deleted
        return Change("d", None, key_fields)
    payload, schema = _unwrap(_document(value, "value"))
    if not isinstance(payload, dict):
        raise ChangeRejected("malformed_change", "the value is not a change event (not an object)")
    op = payload.get("op")
    if not isinstance(op, str) or op not in OPS:
        shown = json.dumps(op)[:40] if op is not None else "none"
        raise ChangeRejected("malformed_change", f"op {shown} is not one of {sorted(OPS)}")
    images = _image_schemas(schema)
    before, after = payload.get("before"), payload.get("after")
    source = payload.get("source")
    tx = source.get("txId") if isinstance(source, dict) else None
    transaction = None if tx is None else str(tx)
    if op in UPSERTS:
        if not isinstance(after, dict):
            raise ChangeRejected("malformed_change", f"op {op!r} without an 'after' object")
        return Change(op, _restored(after, images.get("after")), key_fields, transaction)
    if op == "d":
        image = _restored(before, images.get("before")) if isinstance(before, dict) else None
        return Change(op, image, key_fields, transaction)
    return Change(op, None, None, transaction)


def _image_schemas(schema: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    if schema is None:
        return {}
    return {
        str(f.get("field")): f
        for f in schema.get("fields", ())
        if isinstance(f, dict) and f.get("type") == "struct"
    }


def _restored(image: Mapping[str, Any], schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """``image`` with Connect's encodings of decimals and zone-less times undone, as its struct schema
    says (as it is without one)."""
    if schema is None:
        return dict(image)
    fields = {str(f.get("field")): f for f in schema.get("fields", ()) if isinstance(f, dict)}
    return {name: _value(value, fields.get(name)) for name, value in image.items()}


def _value(value: Any, schema: Mapping[str, Any] | None) -> Any:
    if value is None or schema is None:
        return value
    name = schema.get("name")
    if name == _CONNECT_DECIMAL and isinstance(value, str):
        parameters = schema.get("parameters") or {}
        return unscaled_decimal(value, int(parameters.get("scale", 0)))
    if name == _VARIABLE_DECIMAL and isinstance(value, dict):
        return unscaled_decimal(str(value.get("value", "")), int(value.get("scale", 0)))
    if name == "io.debezium.time.Date" and isinstance(value, int):
        return (_EPOCH + dt.timedelta(days=value)).date().isoformat()
    if isinstance(name, str) and name in _LOCAL_TIMESTAMPS and isinstance(value, int):
        return (_EPOCH + value * _LOCAL_TIMESTAMPS[name]).isoformat().replace("+00:00", "Z")
    if name == "io.debezium.time.NanoTimestamp" and isinstance(value, int):
        return (_EPOCH + dt.timedelta(microseconds=value // 1000)).isoformat().replace("+00:00", "Z")
    if schema.get("type") == "struct" and isinstance(value, dict):
        return _restored(value, schema)
    if schema.get("type") == "array" and isinstance(value, list):
        items = schema.get("items")
        return [_value(v, items if isinstance(items, dict) else None) for v in value]
    return value


def unscaled_decimal(text: str, scale: int) -> Decimal:
    """Connect's decimal: base64 of the unscaled value's big-endian two's complement bytes."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ChangeRejected("malformed_change", f"decimal {text[:40]!r} is not base64") from exc
    return Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(-scale)

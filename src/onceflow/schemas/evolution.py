"""Which changes of a pipeline's reader schema its epochs may take, and which are refused.

The reader schema (the row type of the decoded records, `reader_row_type`) may change between two epochs
of a pipeline: a new Avro subject version, an edited `JsonFormat`. Records already in Kafka, and the rows
earlier epochs wrote to the sinks, have the old shape, so a change is taken only when every old value
still reads, and every sink can hold old and new rows in one table:

* a new field that may be null (``?``), or that has a default (Avro), is taken: the sinks add it as a
  nullable column before the epoch that first writes it;
* a field that may now be null (``T`` to ``T?``), a decimal with more integer digits at the same scale,
  and ``int`` to ``float`` widen, and are taken;
* a field gone from the schema (a rename is a field gone and a field new), a new required field without a
  default, a field that may no longer be null, and any other change of type are refused, naming the
  field, before the epoch is planned. Nothing the user declared is dropped without a word.

Paths name fields as the Avro schema reader does: ``ctx.ip``, ``items[].qty`` (an array's elements),
``attrs{}.n`` (a map's values).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from onceflow.schemas.types import (
    Array,
    DecimalType,
    Map,
    Primitive,
    SchemaType,
    Struct,
    render,
    with_nullable,
)

# Primitive widenings every decoder reads and every sink stores: (old, new).
_WIDENINGS = frozenset({("int", "float")})


@dataclass
class SchemaChange:
    """What a new reader schema changes: fields added and widened (taken), and refusals, each naming
    its field, with what to do about each kind of refusal said once (`hints`)."""

    added: list[str] = field(default_factory=list)
    widened: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.widened or self.refused)

    def refuse(self, what: str, hint: str) -> None:
        self.refused.append(what)
        if hint not in self.hints:
            self.hints.append(hint)

    def refusal(self) -> str:
        """The refusals and their hints, as one line."""
        return f"{'; '.join(self.refused)} ({'; '.join(self.hints)})"


_GONE = "old records and the sinks' columns still hold a field gone: keep it, nullable if it may be missing"
_REQUIRED = "records written before a new field have none: declare it nullable (`?`) or give it a default"
_NARROWED = "values already written may be null: keep the field nullable"
_RETYPED = "old values may not fit a new type, nor new values the sinks' columns: add a new field instead"


def compare(old: Struct, new: Struct, defaulted: Iterable[str] = ()) -> SchemaChange:
    """How ``new`` differs from ``old``; ``defaulted``: paths of new fields that have a default."""
    change = SchemaChange()
    _struct(old, new, "", frozenset(defaulted), change)
    return change


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _struct(old: Struct, new: Struct, path: str, defaulted: frozenset[str], change: SchemaChange) -> None:
    now = dict(new.fields)
    for name, old_type in old.fields:
        here = _join(path, name)
        if name not in now:
            change.refuse(f"{here} ({render(old_type)}) is gone from the schema (removed or renamed)", _GONE)
        else:
            _type(old_type, now[name], here, defaulted, change)
    before = {name for name, _ in old.fields}
    for name, new_type in new.fields:
        here = _join(path, name)
        if name in before:
            continue
        if new_type.nullable or here in defaulted:
            change.added.append(here)
        else:
            change.refuse(f"{here} ({render(new_type)}) is new and required without a default", _REQUIRED)


def _type(
    old: SchemaType, new: SchemaType, here: str, defaulted: frozenset[str], change: SchemaChange
) -> None:
    if old.nullable and not new.nullable:
        change.refuse(f"{here} may no longer be null ({render(old)} to {render(new)})", _NARROWED)
        return
    if old.nullable != new.nullable:
        change.widened.append(here)
    a, b = with_nullable(old, False), with_nullable(new, False)
    if isinstance(a, Struct) and isinstance(b, Struct):
        _struct(a, b, here, defaulted, change)
    elif isinstance(a, Array) and isinstance(b, Array):
        _type(a.element, b.element, f"{here}[]", defaulted, change)
    elif isinstance(a, Map) and isinstance(b, Map):
        _type(a.value, b.value, f"{here}{{}}", defaulted, change)
    elif a == b:
        return
    elif _widens(a, b):
        change.widened.append(here)
    else:
        change.refuse(f"{here} changed type from {render(a)} to {render(b)}", _RETYPED)


def _widens(old: SchemaType, new: SchemaType) -> bool:
    if isinstance(old, Primitive) and isinstance(new, Primitive):
        return (old.name, new.name) in _WIDENINGS
    if isinstance(old, DecimalType) and isinstance(new, DecimalType):
        return new.scale == old.scale and new.precision >= old.precision
    return False

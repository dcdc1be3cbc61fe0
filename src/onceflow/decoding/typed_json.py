"""A JSON format's schema as one typed decoder: a record is parsed and every field's kind checked in
a single call into msgspec's C decoder, instead of ``json`` building a dict that Python then walks.

It only ever says yes or "not sure". A record it accepts gets exactly the values the exact decoder
(`onceflow.decoding.records.RowDecoder`'s ``json`` path) would give it; for anything else it returns None and
the exact decoder decides, so that every dead letter and its reason stay the ``json`` module's. Where
the two parsers differ, the typed one is the stricter or is kept out:

- ``json`` reads ``NaN``, ``1e400`` (as infinity), lone surrogate escapes and integers of any size;
  msgspec refuses them (the exact decoder then turns them into a value or a dead letter).
- msgspec skips unknown fields without checking their UTF-8, so it gets text, never bytes: decoding
  the value to ``str`` first is the exact decoder's first step too.
- The nesting at which each runs out of stack differs by a few levels, so a text with more than
  `MAX_OPENINGS` brackets goes to the exact decoder whatever its depth.
- Ints must fit in 64 bits, as the exact decoder requires (msgspec would take up to 2**64 - 1).
- Nested structs, arrays and maps of those four types are msgspec's nested structs, lists and dicts;
  both parsers keep the last of duplicate keys (msgspec fails where the two values' types differ), a
  missing or null nullable field is None in both, and structs become dicts of their declared fields in
  schema order, as the exact decoder builds them. Any other type (time, decimal, bytes, json) is not
  handled here at all (`handles`): its format takes the exact path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any

from onceflow.schemas.types import (
    Array,
    Map,
    Primitive,
    SchemaType,
    Struct,
    is_flat,
    parse_type,
    walk,
    with_nullable,
)

# A text with more opening brackets than this is left to the exact decoder: its depth could be near
# the stack limit, where the two parsers disagree (about 1,000 levels). Records have a handful.
MAX_OPENINGS = 256

_INT64 = (-(2**63), 2**63 - 1)
# The primitives whose msgspec reading is the exact decoder's (see the module's notes above).
_HANDLED = frozenset({"string", "int", "float", "bool"})


def handles(t: SchemaType) -> bool:
    """Whether the typed decoder can decode ``t`` exactly as the exact decoder does: the four JSON
    primitives, and structs, arrays and maps of them."""
    return all(
        isinstance(s, Struct | Array | Map) or (isinstance(s, Primitive) and s.name in _HANDLED)
        for s in walk(t)
    )


def typed_decoder(fields: Sequence[tuple[str, str, bool]]) -> Callable[[str], tuple[Any, ...] | None]:
    """For (name, base type text, nullable) fields, in order: a function from a record's text to its
    field values in that order, or None where the exact decoder must decide. Every type must be one
    `handles` accepts (ValueError otherwise)."""
    import msgspec

    kinds: dict[str, Any] = {
        "string": str,
        "int": Annotated[int, msgspec.Meta(ge=_INT64[0], le=_INT64[1])],
        "float": float,
        "bool": bool,
    }
    structs = [0]  # how many nested struct types are made, for their names

    def typed(t: SchemaType) -> Any:
        if not handles(t):
            raise ValueError(f"the typed decoder does not handle {t}")
        found: Any
        if isinstance(t, Primitive):
            found = kinds[t.name]
        elif isinstance(t, Array):
            found = list[typed(t.element)]  # type: ignore[misc]  # a type built at run time
        elif isinstance(t, Map):
            found = dict[str, typed(t.value)]  # type: ignore[misc]
        else:
            assert isinstance(t, Struct)
            structs[0] += 1
            found = struct(f"Nested{structs[0]}", t.fields)
        return found | None if t.nullable else found

    def struct(name: str, members: Sequence[tuple[str, SchemaType]]) -> Any:
        # Attribute names are positional: a schema's field names need not be Python identifiers. A
        # nullable member defaults to None: absent or null, as the exact decoder reads it.
        attributes = [
            (f"f{i}", typed(t), None) if t.nullable else (f"f{i}", typed(t))
            for i, (_, t) in enumerate(members)
        ]
        # kw_only: a required field may follow an optional one, as in the schema.
        return msgspec.defstruct(
            name, attributes, kw_only=True, rename={f"f{i}": n for i, (n, _) in enumerate(members)}
        )

    trees = [parse_type(base) for _, base, _ in fields]
    row = struct(
        "TypedRow",
        [(name, with_nullable(t, nullable)) for (name, _, nullable), t in zip(fields, trees, strict=True)],
    )
    decode = msgspec.json.Decoder(row).decode
    as_tuple = msgspec.structs.astuple
    # Nested values leave msgspec as structs: as dicts of their declared fields, as the row holds them.
    nested = [i for i, t in enumerate(trees) if not is_flat(t)]
    to_builtins = msgspec.to_builtins

    def values(text: str) -> tuple[Any, ...] | None:
        # (A text no longer than MAX_OPENINGS cannot hold more; most records are that short.)
        if len(text) > MAX_OPENINGS and text.count("[") + text.count("{") > MAX_OPENINGS:
            return None
        try:
            found = as_tuple(decode(text))
        except Exception:  # not accepted as it stands: the exact decoder gives the value or the reason
            return None
        if not nested:
            return found
        listed = list(found)
        for i in nested:
            listed[i] = to_builtins(listed[i])
        return tuple(listed)

    return values

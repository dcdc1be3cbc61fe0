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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any

# A text with more opening brackets than this is left to the exact decoder: its depth could be near
# the stack limit, where the two parsers disagree (about 1,000 levels). Records have a handful.
MAX_OPENINGS = 256

_INT64 = (-(2**63), 2**63 - 1)


def typed_decoder(fields: Sequence[tuple[str, str, bool]]) -> Callable[[str], tuple[Any, ...] | None]:
    """For (name, base type, nullable) fields, in order: a function from a record's text to its field
    values in that order, or None where the exact decoder must decide."""
    import msgspec

    kinds: dict[str, Any] = {
        "string": str,
        "int": Annotated[int, msgspec.Meta(ge=_INT64[0], le=_INT64[1])],
        "float": float,
        "bool": bool,
    }
    # Attribute names are positional: a schema's field names need not be Python identifiers.
    attributes = [
        (f"f{i}", kinds[base] | None, None) if nullable else (f"f{i}", kinds[base])
        for i, (_, base, nullable) in enumerate(fields)
    ]
    # kw_only: a required field may follow an optional one, as in the schema.
    row = msgspec.defstruct(
        "TypedRow",
        attributes,
        kw_only=True,
        rename={f"f{i}": name for i, (name, _, _) in enumerate(fields)},
    )
    decode = msgspec.json.Decoder(row).decode
    as_tuple = msgspec.structs.astuple

    def values(text: str) -> tuple[Any, ...] | None:
        # (A text no longer than MAX_OPENINGS cannot hold more; most records are that short.)
        if len(text) > MAX_OPENINGS and text.count("[") + text.count("{") > MAX_OPENINGS:
            return None
        try:
            return as_tuple(decode(text))
        except Exception:  # not accepted as it stands: the exact decoder gives the value or the reason
            return None

    return values

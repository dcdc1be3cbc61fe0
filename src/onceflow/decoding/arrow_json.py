"""A batch of flat JSON records decoded by Arrow's native JSON reader, where it provably agrees with
the exact decoder, instead of one Python call per record.

The Python read path spent most of its time per record: a typed parse, a tuple, a generator step and
a transposition into columns. Arrow's reader parses the batch's values, joined by newlines, straight
into columns. It only ever says yes or "not sure", like the typed decoder
(`onceflow.decoding.typed_json`): it answers for a whole batch or not at all, and a batch it leaves goes
record by record through `RowDecoder`, which gives every dead letter its reason. It answers only when
each of these holds:

- The format is JSON, flat, of strings, ints, floats and bools, with no change events: Arrow's
  conversions of those four agree with the exact decoder's, and refuse every mismatch (a number for a
  string, a fraction or a number beyond 64 bits for an int, a string for a number...).
- Every record has a value within ``max_record_bytes`` (with its key), starts with ``{`` and holds no
  newline, so that one line is one record; the reader then gives exactly one row per record or fails
  (two objects on one line make two rows, and the count is checked).
- The batch is UTF-8 as a whole (a character cannot straddle two records: a newline separates them).
- No escaped surrogate (``\\ud8..``): the exact decoder checks what they make of a string.
- No ``Inf`` or ``NaN`` token: Arrow's parser reads ``Inf``, which JSON does not have.
- No record with more than `MAX_OPENINGS` brackets, where the exact decoder may run out of stack and
  Arrow does not.
- Arrow reads it without error (it refuses duplicate keys, trailing text, comments, single quotes,
  trailing commas, control characters in strings...), no field the schema requires is null or
  missing, and every float is finite and no zero is negative (Arrow reads an int beyond the double
  range as infinity, which the exact decoder refuses, and the int ``-0`` as -0.0, which it reads as
  0.0).

``tests/unit/test_arrow_json.py`` runs both decoders over hostile records, one batch per record and
all in one batch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from onceflow.decoding.typed_json import MAX_OPENINGS
from onceflow.pipeline import JsonFormat, RecordFormat
from onceflow.schemas.types import Primitive, parse_type

if TYPE_CHECKING:
    import pyarrow as pa

# A bare Inf or NaN after a colon, a comma or a bracket: Arrow's parser reads Inf (and NaN) as numbers.
# The same letters inside a string only cost the batch the record-by-record path.
_LENIENT_TOKEN = re.compile(rb"[:,\[]\s*-?(?:Inf|NaN)")
_NATIVE = frozenset({"string", "int", "float", "bool"})


def native_fields(fmt: RecordFormat) -> tuple[str, ...] | None:
    """The format's field names when Arrow's reader can decode its records (flat JSON of the four
    primitives, no change events), else None."""
    if not isinstance(fmt, JsonFormat) or fmt.changes is not None:
        return None
    for name in fmt.schema:
        kind = parse_type(fmt.field_type(name)[0])
        if not (isinstance(kind, Primitive) and kind.name in _NATIVE):
            return None
    return tuple(fmt.schema)


class NativeJsonDecoder:
    """Decodes whole batches of one flat JSON format's records with Arrow's reader (see the module).

    ``fields`` are the Arrow fields of the format's columns, in schema order, then its key column when
    the format has one: the types the slice's batches carry."""

    def __init__(self, fmt: JsonFormat, max_record_bytes: int, fields: Sequence[pa.Field]) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.json as pj

        names = native_fields(fmt)
        if names is None:
            raise ValueError("Arrow's reader decodes only flat JSON of strings, ints, floats and bools")
        self._key = fmt.key_field
        self._value_fields = list(fields)[: len(names)]
        self._key_field = list(fields)[len(names)] if self._key is not None else None
        self._required = [name for name in names if not fmt.field_type(name)[1]]
        self._floats = [i for i, name in enumerate(names) if fmt.field_type(name)[0] == "float"]
        self._limit = max_record_bytes
        self._parse = pj.ParseOptions(
            explicit_schema=pa.schema(self._value_fields), unexpected_field_behavior="ignore"
        )
        self._pa, self._pc, self._pj = pa, pc, pj

    def decode(self, values: Sequence[bytes | None], keys: Sequence[bytes | None]) -> list[pa.Array] | None:
        """The columns (the format's fields, then its key) of the records whose values and keys these
        are, one value per record in order; None when the batch must go record by record."""
        pa, n = self._pa, len(values)
        if n == 0 or None in values:
            return None
        longest = max(map(len, values))  # type: ignore[arg-type]  # no None: checked above
        if longest + max(map(len, filter(None, keys)), default=0) > self._limit and any(
            len(v) + len(k or b"") > self._limit  # type: ignore[arg-type]
            for v, k in zip(values, keys, strict=True)
        ):
            return None
        joined = b"\n".join(values)  # type: ignore[arg-type]
        if not _lines_are_records(joined, values, n, longest):  # type: ignore[arg-type]
            return None
        key_column = None
        if self._key_field is not None:
            try:
                key_column = pa.array([k.decode("utf-8") for k in keys], self._key_field.type)  # type: ignore[union-attr]
            except (AttributeError, UnicodeDecodeError):  # a record without a key, or not UTF-8
                return None
        try:
            table = self._pj.read_json(
                pa.BufferReader(joined),
                read_options=self._pj.ReadOptions(use_threads=False, block_size=len(joined) + 1),
                parse_options=self._parse,
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        if table.num_rows != n or any(table.column(name).null_count for name in self._required):
            return None
        columns = [table.column(i).combine_chunks() for i in range(table.num_columns)]
        if any(not self._exact_floats(columns[i]) for i in self._floats):
            return None
        return columns if key_column is None else [*columns, key_column]

    def _exact_floats(self, column: pa.Array) -> bool:
        """Whether a float column holds what the exact decoder reads: an int too large for a double is
        infinity to Arrow (the exact decoder refuses it), and the int ``-0`` is -0.0 to Arrow (0.0 to
        the exact decoder). Only zeros are looked at one by one, and any negative one declines."""
        pc = self._pc
        if pc.is_finite(column).false_count:
            return False
        zeros = pc.equal(column, 0.0)
        return not zeros.true_count or all(
            math.copysign(1.0, z) > 0 for z in column.filter(zeros).to_pylist()
        )


def _lines_are_records(joined: bytes, values: Sequence[bytes], n: int, longest: int) -> bool:
    """Whether each line of ``joined`` is one whole record that Arrow reads as the exact decoder does,
    as far as the bytes tell (see the module's list). A search for one byte is many times faster than
    one for a few, so the rarer patterns are looked for only where their first byte occurs."""
    # Arrow skips blank lines: every record must start with "{" (the least and the greatest of them do,
    # so all do, and none is empty), and hold no newline.
    if min(values)[:1] != b"{" or max(values)[:1] != b"{" or joined.count(b"\n") != n - 1:
        return False
    try:
        joined.decode("utf-8")
    except UnicodeDecodeError:
        return False
    if b"\\" in joined and (b"\\ud" in joined or b"\\uD" in joined):
        return False
    if ((b"I" in joined and b"Inf" in joined) or (b"N" in joined and b"NaN" in joined)) and (
        _LENIENT_TOKEN.search(joined)
    ):
        return False
    # A record no longer than the limit cannot hold more openings than that.
    if longest > MAX_OPENINGS:
        return not any(v.count(b"{") + v.count(b"[") > MAX_OPENINGS for v in values)
    return True

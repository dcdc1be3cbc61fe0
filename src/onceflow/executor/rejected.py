"""Records the JVM did not accept, decoded in Python: `RowDecoder` gives each its row or its dead letter.

The JVM read (`onceflow.engine.jvm_read`) turns into rows only the records it can prove good; every
other record crosses to a Python worker as raw Kafka columns (a struct column of Arrow batches, in its
place among the records of its task), so that the decoder that the Python reader uses stays the one
arbiter of every doubtful record and of every dead letter's reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from onceflow.decoding.avro_records import registry_for
from onceflow.decoding.records import DeadLetter, KafkaRecord, RowDecoder
from onceflow.pipeline import AvroFormat, RecordFormat

# The Kafka columns a rejected record carries to Python (`_timestamp` in ms, null when Kafka has none).
RAW_COLUMNS: tuple[str, ...] = ("topic", "partition", "offset", "_timestamp", "key", "value", "headers")


def with_dead_letters(items: Iterable[Any], width: int) -> Iterator[tuple[Any, ...]]:
    """Decoded items as row tuples of ``width`` fields plus a last column: the dead letter's JSON, or
    None on a good row (the shape both read paths hand to the slice's driver)."""
    blank = (None,) * width
    for item in items:
        yield (*blank, item.to_json()) if isinstance(item, DeadLetter) else (*item, None)


def kafka_record(row: dict[str, Any]) -> KafkaRecord:
    """A `KafkaRecord` from one row of `RAW_COLUMNS` as Arrow gives it."""
    headers = row.get("headers") or ()
    return KafkaRecord(
        topic=row["topic"],
        partition=int(row["partition"]),
        offset=int(row["offset"]),
        timestamp=None if row["_timestamp"] is None else int(row["_timestamp"]),
        key=row["key"],
        value=row["value"],
        headers=tuple((str(h["key"]), h["value"]) for h in headers),
    )


def decode_rejected_column(
    raw: Any,
    fmt: RecordFormat,
    max_record_bytes: int,
    schema: Any,
    registry_url: str | None = None,
    allow_insecure_auth: bool = False,
) -> Any:
    """A struct column of `RAW_COLUMNS` in (Arrow; null where the JVM decoded the record itself), a
    struct column of ``schema`` (rows plus the dead-letter column) out: the decoded row or dead letter at
    each non-null input's position, null elsewhere, so the records stay in their order. ``registry_url``
    is the deployment's schema registry, for Avro formats (its credentials over plain http only with
    ``allow_insecure_auth``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(raw, pa.ChunkedArray):
        raw = raw.combine_chunks()
    fields = list(schema)
    if raw.null_count == len(raw):
        return pa.nulls(len(raw), type=pa.struct(fields))
    registry = registry_for(registry_url, allow_insecure_auth) if isinstance(fmt, AvroFormat) else None
    decoder = RowDecoder(fmt, max_record_bytes, registry)
    width = len(decoder.columns)
    valid = raw.is_valid()
    columns: list[list[Any]] = [[None] * len(raw) for _ in fields]
    positions = pc.indices_nonzero(valid).to_pylist()
    items = (decoder.decode(kafka_record(row)) for row in raw.filter(valid).to_pylist())
    for position, values in zip(positions, with_dead_letters(items, width), strict=True):
        for column, value in zip(columns, values, strict=True):
            column[position] = value
    return pa.StructArray.from_arrays(
        [pa.array(column, type=field.type) for column, field in zip(columns, fields, strict=True)],
        fields=fields,
        mask=pc.invert(valid),
    )

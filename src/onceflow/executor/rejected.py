"""Records the JVM did not accept, decoded in Python: `RowDecoder` gives each its row or its dead letter.

The JVM read (`onceflow.engine.jvm_read`) turns into rows only the records it can prove good; every
other record crosses to a Python worker as raw Kafka columns (Arrow batches), so that the decoder that
the Python reader uses stays the one arbiter of every doubtful record and of every dead letter's reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from onceflow.executor.arrow_rows import row_batches
from onceflow.pipeline import RecordFormat
from onceflow.records import DeadLetter, KafkaRecord, RowDecoder

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


def decode_rejected(
    batches: Iterable[Any], fmt: RecordFormat, max_record_bytes: int, schema: Any
) -> Iterator[Any]:
    """Arrow batches of `RAW_COLUMNS` in, Arrow batches of ``schema`` (rows plus the dead-letter
    column) out: one output row per input record."""
    decoder = RowDecoder(fmt, max_record_bytes)
    width = len(decoder.columns)
    for batch in batches:
        items = (decoder.decode(kafka_record(row)) for row in batch.to_pylist())
        yield from row_batches(with_dead_letters(items, width), schema)

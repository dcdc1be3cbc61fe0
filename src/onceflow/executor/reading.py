"""Read task: exactly one range of committed records, decoded into rows or dead letters.

Two shapes of the same read: `read_task` yields a record at a time (the local executor holds a task in
memory), `read_task_batches` yields Arrow record batches for a Spark task, decoding a fetched batch at a
time with Arrow's JSON reader where it agrees with `RowDecoder` (`onceflow.decoding.arrow_json`), and
record by record where it does not.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from onceflow.decoding.arrow_json import NativeJsonDecoder, native_fields
from onceflow.decoding.avro_records import registry_for
from onceflow.decoding.records import DeadLetter, KafkaRecord, RowDecoder
from onceflow.executor.arrow_rows import BATCH_ROWS, row_batches
from onceflow.executor.rejected import with_dead_letters
from onceflow.executor.slices import SliceRef
from onceflow.faults import crash_point
from onceflow.pipeline import AvroFormat, JsonFormat
from onceflow.sources.kafka_planning import ReadTask
from onceflow.sources.kafka_range import Fetched, read_range, read_range_batches


def read_task(ref: SliceRef, task: ReadTask, decoder: RowDecoder | None = None) -> Iterator[Any]:
    """Yield the task's records in offset order, each as a row tuple or as a `DeadLetter`.

    Rows are tuples in `onceflow.decoding.records.row_columns` order. Dead letters are not written anywhere
    here: they go back to the slice's driver with the rows, which records them with the slice's pre-commits,
    so that a replay records them again only for a new epoch.
    """
    decoder = decoder or task_decoder(ref)
    middle = _middle(task)
    for record in read_range(ref.bootstrap, task.range):
        if record.offset >= middle:
            crash_point("task_mid_read")
            middle = task.range.until_offset  # once per task
        yield decoder.decode(record)


def read_task_batches(ref: SliceRef, task: ReadTask, schema: Any) -> Iterator[Any]:
    """The task's records in offset order as Arrow record batches of ``schema`` (the row columns, then
    the dead-letter column: the dead letter's JSON on a rejected record, null on a row), each record
    once, in its place: what `read_task` yields, batch by batch."""
    batch_decoder = BatchDecoder(task_decoder(ref), schema)
    middle = _middle(task)
    pending: list[Fetched] = []
    waiting = 0
    # Fetches stay small (a fetch of a whole batch waits for it instead of overlapping the decoding);
    # decoding takes them BATCH_ROWS at a time.
    for fetched in read_range_batches(ref.bootstrap, task.range):
        if fetched.offsets()[-1] >= middle:
            crash_point("task_mid_read")
            middle = task.range.until_offset  # once per task
        pending.append(fetched)
        waiting += len(fetched)
        if waiting >= BATCH_ROWS:
            yield from batch_decoder.decode(Fetched.joined(pending))
            pending, waiting = [], 0
    if pending:
        yield from batch_decoder.decode(Fetched.joined(pending))


class Records(Protocol):
    """Consecutive records of one partition, read as columns or as records (`Fetched` is one)."""

    topic: str
    partition: int

    def __len__(self) -> int: ...
    def offsets(self) -> list[int]: ...
    def values(self) -> list[bytes | None]: ...
    def keys(self) -> list[bytes | None]: ...
    def timestamps(self) -> list[int | None]: ...
    def records(self) -> list[KafkaRecord]: ...


class RecordList:
    """`Records` over records already made (what the local executor and the tests hold)."""

    def __init__(self, records: Sequence[KafkaRecord]) -> None:
        self._records = list(records)
        self.topic, self.partition = self._records[0].topic, self._records[0].partition

    def __len__(self) -> int:
        return len(self._records)

    def offsets(self) -> list[int]:
        return [r.offset for r in self._records]

    def values(self) -> list[bytes | None]:
        return [r.value for r in self._records]

    def keys(self) -> list[bytes | None]:
        return [r.key for r in self._records]

    def timestamps(self) -> list[int | None]:
        return [r.timestamp for r in self._records]

    def records(self) -> list[KafkaRecord]:
        return self._records


class BatchDecoder:
    """Turns a batch of one task's records into Arrow record batches of the slice's ``schema`` (the row
    columns of the decoder's format, then the dead-letter column): whole by Arrow's JSON reader where
    the format and the batch allow it, else record by record through the task's `RowDecoder` (which
    counts the dead letters it makes, across batches)."""

    def __init__(self, decoder: RowDecoder, schema: Any) -> None:
        fmt = decoder.fmt
        self._decoder = decoder
        self._schema = schema
        self._width = len(schema) - 1  # the row columns, without the dead-letter column
        self._types = [field.type for field in schema]
        # The format's fields and its key come before the four Kafka columns (`row_columns`).
        self._native = (
            NativeJsonDecoder(fmt, decoder.max_record_bytes, list(schema)[: self._width - 4])
            if isinstance(fmt, JsonFormat) and native_fields(fmt) is not None
            else None
        )

    def decode(self, batch: Records) -> Iterator[Any]:
        """Records of one partition, in offset order."""
        import pyarrow as pa

        columns = self._native.decode(batch.values(), batch.keys()) if self._native is not None else None
        if columns is None:
            decoded = (self._decoder.decode(record) for record in batch.records())
            yield from row_batches(with_dead_letters(decoded, self._width), self._schema)
            return
        n = len(batch)
        topic, partition, offset, timestamp, dead_letter = self._types[-5:]
        yield pa.RecordBatch.from_arrays(
            [
                *columns,
                pa.repeat(pa.scalar(batch.topic, topic), n),
                pa.repeat(pa.scalar(batch.partition, partition), n),
                pa.array(batch.offsets(), offset),
                pa.array(batch.timestamps(), timestamp),
                pa.nulls(n, dead_letter),
            ],
            schema=self._schema,
        )


def _middle(task: ReadTask) -> int:
    """The offset at which a read passes the ``task_mid_read`` crash point."""
    return task.range.from_offset + (task.range.until_offset - task.range.from_offset) // 2


def task_decoder(ref: SliceRef) -> RowDecoder:
    """The decoder of one task of the slice; an Avro format gets this process's client of the
    deployment's schema registry."""
    spec = ref.pipeline
    registry = (
        registry_for(ref.task.schema_registry_url, ref.task.schema_registry_allow_insecure_auth)
        if isinstance(spec.format, AvroFormat)
        else None
    )
    return RowDecoder(spec.format, spec.max_record_bytes, registry)


def split(items: Iterator[Any]) -> tuple[list[tuple[Any, ...]], list[DeadLetter]]:
    """Rows and dead letters of a read, apart (for the local executor, which holds a task in memory)."""
    rows: list[tuple[Any, ...]] = []
    dead: list[DeadLetter] = []
    for item in items:
        (dead if isinstance(item, DeadLetter) else rows).append(item)
    return rows, dead

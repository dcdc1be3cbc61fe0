"""Read task: exactly one range of committed records, decoded into rows or dead letters."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from onceflow.decoding.avro_records import registry_for
from onceflow.decoding.records import DeadLetter, RowDecoder
from onceflow.executor.slices import SliceRef
from onceflow.faults import crash_point
from onceflow.pipeline import AvroFormat
from onceflow.sources.kafka_planning import ReadTask
from onceflow.sources.kafka_range import read_range


def read_task(ref: SliceRef, task: ReadTask, decoder: RowDecoder | None = None) -> Iterator[Any]:
    """Yield the task's records in offset order, each as a row tuple or as a `DeadLetter`.

    Rows are tuples in `onceflow.decoding.records.row_columns` order. Dead letters are not written anywhere
    here: they go back to the slice's driver with the rows, which records them with the slice's pre-commits,
    so that a replay records them again only for a new epoch.
    """
    decoder = decoder or task_decoder(ref)
    middle = task.range.from_offset + (task.range.until_offset - task.range.from_offset) // 2
    for record in read_range(ref.bootstrap, task.range):
        if record.offset >= middle:
            crash_point("task_mid_read")
            middle = task.range.until_offset  # once per task
        yield decoder.decode(record)


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

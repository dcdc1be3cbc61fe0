"""Write task: stage one output partition in one sink and hand its committable back to the driver."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onceflow import redact
from onceflow.committables import Committable, TaskContext
from onceflow.errors import SliceFailed, one_line
from onceflow.executor.arrow_rows import batch_rows, rows_of
from onceflow.executor.slices import SliceRef
from onceflow.faults import crash_point
from onceflow.pipeline import SinkSpec
from onceflow.sinks.base import SinkWriter, supports_batches
from onceflow.sinks.registry import sink_kind

if TYPE_CHECKING:
    import pyarrow as pa

_log = logging.getLogger(__name__)

# Rows per ``write(rows)`` call when a writer is fed rows.
WRITE_BATCH = 2000


def spark_task_attempt(task_ids: Sequence[str], what: str) -> tuple[int, str]:
    """This Spark task's output partition and attempt name (one per Spark task attempt).

    Called inside the Spark task, so it lives with the write task: a function of the driver's modules
    would make every Python worker import the coordinator and the ledger (and SQLAlchemy) to find it.
    """
    from pyspark import TaskContext as SparkTaskContext

    context = SparkTaskContext.get()
    assert context is not None, "a write runs inside a Spark task"
    index = context.partitionId()
    if index >= len(task_ids):
        raise SliceFailed(
            f"output partition {index} of {what} has no participant: the query ran with more "
            f"partitions than its {len(task_ids)} tasks (was adaptive execution re-enabled?)"
        )
    return index, f"{context.stageId()}.{index}.{context.taskAttemptId()}"


@dataclass(frozen=True)
class TaskReport:
    """One write task's outcome for one sink, sent back to the driver (a Spark row on the way)."""

    sink: str
    task: str
    attempt: str
    records: int
    committable: str  # `Committable.to_json()`

    def to_committable(self) -> Committable:
        return Committable.from_json(self.committable)


def write_task(
    ref: SliceRef, sink: SinkSpec, task_id: str, attempt: str, rows: Iterable[Mapping[str, Any]]
) -> TaskReport:
    """Stage one attempt of one output task from rows (the local executor's path); see `_stage`."""
    return _stage(ref, sink, task_id, attempt, lambda writer: _feed_rows(writer, rows))


def sinks_task(
    ref: SliceRef,
    sinks: Sequence[tuple[SinkSpec, Sequence[str] | None]],
    task_ids: Sequence[str],
    what: str,
    report_schema: pa.Schema,
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """What ``mapInArrow`` runs in each Spark task of a slice: output partition i stages read task i's
    batches in every sink (one or more) and yields one report per sink. Made here, so that what Spark
    ships to the Python workers refers to task-side modules only."""

    def write(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        index, attempt = spark_task_attempt(task_ids, what)
        reports = write_task_sinks(ref, sinks, task_ids[index], attempt, batches)
        yield pa.RecordBatch.from_pylist([r.__dict__ for r in reports], schema=report_schema)

    return write


def write_task_batches(
    ref: SliceRef, sink: SinkSpec, task_id: str, attempt: str, batches: Iterable[pa.RecordBatch]
) -> TaskReport:
    """Stage one attempt of one output task from Arrow record batches (a Spark task's path).

    A writer with ``write_batch`` gets the batches as they are; any other writer gets their rows,
    converted once, in the same calls as `write_task` makes."""
    return _stage(ref, sink, task_id, attempt, lambda writer: _feed_batches(writer, batches))


def write_task_sinks(
    ref: SliceRef,
    sinks: Sequence[tuple[SinkSpec, Sequence[str] | None]],
    task_id: str,
    attempt: str,
    batches: Iterable[pa.RecordBatch],
) -> list[TaskReport]:
    """Stage one attempt of one task in every sink at once, from one stream of Arrow batches.

    Each sink gets its columns of each batch (all of them where it names none), in the stream's order,
    so the task reads and transforms its range once whatever the number of sinks. The steps are
    `_stage`'s, for all sinks together: begin each; write each batch to each; then, sink by sink,
    pre-commit. A failure rolls back the staging of every sink not yet pre-committed and fails the task
    (Spark retries it as another attempt); an attempt that never reports is the sweeper's.
    """
    writers: list[tuple[SinkSpec, Sequence[str] | None, SinkWriter]] = []
    counts = [0] * len(sinks)
    done = 0
    try:
        for sink, columns in sinks:
            kind = sink_kind(sink.kind)
            writer = kind.build_writer(ref.task.sink_config(sink))
            writers.append((sink, columns, writer))
            writer.begin(_context(ref, sink, task_id, attempt))
        for batch in batches:
            if not batch.num_rows:
                continue
            for index, (_, columns, writer) in enumerate(writers):
                part = batch if columns is None else batch.select(list(columns))
                if supports_batches(writer):
                    writer.write_batch(part)
                else:  # in the calls `write_task` makes
                    for rows in _batches(rows_of(part)):
                        writer.write(rows)
                counts[index] += part.num_rows
        reports = []
        for index, (sink, _, writer) in enumerate(writers):
            crash_point("task_after_stage")
            committable = writer.pre_commit()
            done = index + 1
            crash_point("task_after_precommit")
            reports.append(TaskReport(sink.name, task_id, attempt, counts[index], committable.to_json()))
    except BaseException:
        for _, _, writer in writers[done:]:
            writer.abort()
        raise
    return reports


def _context(ref: SliceRef, sink: SinkSpec, task_id: str, attempt: str) -> TaskContext:
    return TaskContext(
        pipeline=ref.pipeline.name,
        epoch=ref.epoch,
        slice=ref.slice,
        task=task_id,
        attempt=attempt,
        sink=sink.name,
        inputs=ref.slice_ranges,
        replaces=ref.replaces,
    )


def _stage(
    ref: SliceRef, sink: SinkSpec, task_id: str, attempt: str, feed: Callable[[SinkWriter], int]
) -> TaskReport:
    """Stage one attempt of one output task: begin, write, pre-commit, report.

    1. Build the sink kind's writer and begin the attempt.
    2. Write the task's output (``feed`` returns how many rows it wrote); a failure rolls this attempt's
       staging back and fails the task (Spark retries it as another attempt).
    3. Pre-commit: the output is durable but invisible, described by a committable.
    4. Return the committable; the driver registers it, or rolls it back if another attempt won.
    """
    # 1.
    kind = sink_kind(sink.kind)
    writer = kind.build_writer(ref.task.sink_config(sink))
    try:
        writer.begin(_context(ref, sink, task_id, attempt))
        # 2.
        count = feed(writer)
        crash_point("task_after_stage")
        # 3.
        committable = writer.pre_commit()
    except BaseException:
        try:
            writer.abort()
        except Exception as exc:  # what is left is the sweeper's; the task reports its own failure
            shown = one_line(redact.text(exc))
            _log.warning("%s: rolling back the failed attempt %s failed too: %s", sink.name, attempt, shown)
        raise
    crash_point("task_after_precommit")
    # 4.
    return TaskReport(sink.name, task_id, attempt, count, committable.to_json())


def _feed_rows(writer: SinkWriter, rows: Iterable[Mapping[str, Any]]) -> int:
    count = 0
    for batch in _batches(rows):
        writer.write(batch)
        count += len(batch)
    return count


def _feed_batches(writer: SinkWriter, batches: Iterable[pa.RecordBatch]) -> int:
    if not supports_batches(writer):
        return _feed_rows(writer, batch_rows(batches))
    count = 0
    for batch in batches:
        if batch.num_rows:
            writer.write_batch(batch)
            count += batch.num_rows
    return count


def _batches(rows: Iterable[Mapping[str, Any]]) -> Iterator[list[Mapping[str, Any]]]:
    batch: list[Mapping[str, Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= WRITE_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch

"""What Spark executors run for a slice: exact reads with decoding, and sink writes with pre-commit.

These functions are shipped to executors by Spark (cloudpickle); they import only the source reader,
the decoder, sink writers and the ledger, never Airflow, and open their own connections.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from onceflow.faults import crash_point
from onceflow.ledger import Ledger, LosingAttempt, PrecommitRefused
from onceflow.offsets import OffsetRange
from onceflow.pipeline import Pipeline, SinkSpec
from onceflow.records import DeadLetter, RowDecoder
from onceflow.sinks.base import TaskContext
from onceflow.sinks.errors import ConflictingAttempt
from onceflow.sources.kafka_planning import ReadTask
from onceflow.sources.kafka_range import read_range

WRITE_BATCH = 2000
# A TaskResult's reason when another attempt of the same task is the accepted one: not a failure.
LOST_TO_ANOTHER_ATTEMPT = "another attempt already won"


@dataclass(frozen=True)
class EpochRef:
    """What every task of a slice needs to know about its epoch (small: it travels in each closure)."""

    pipeline: Pipeline
    epoch: int
    attempt_token: str
    slice: int
    slice_ranges: tuple[OffsetRange, ...]
    bootstrap: str
    ledger_url: str
    replaces: tuple[int, ...] = ()  # committed epochs of the same interval whose output this one replaces


def read_tasks(ref: EpochRef, tasks: Iterable[ReadTask]) -> Iterator[tuple[Any, ...]]:
    """Read each task's exact range, decode it, and keep bad records as dead letters in the ledger.

    Yields rows as tuples in `onceflow.records.row_columns` order. Dead letters are recorded before the
    task returns, fenced by the epoch's attempt token, so a replay records them again only for a new epoch.
    """
    spec = ref.pipeline
    decoder = RowDecoder(spec.format, spec.max_record_bytes)
    for task in tasks:
        dead: list[DeadLetter] = []
        middle = task.range.from_offset + (task.range.until_offset - task.range.from_offset) // 2
        for record in read_range(ref.bootstrap, task.range):
            if record.offset >= middle:
                crash_point("task_mid_read")
                middle = task.range.until_offset  # once per task
            decoded = decoder.decode(record)
            if isinstance(decoded, DeadLetter):
                dead.append(decoded)
            else:
                yield decoded
        if dead:
            ledger = Ledger.connect(ref.ledger_url)
            try:
                ledger.add_dead_letters(
                    spec.name, ref.epoch, dead, ref.attempt_token, after_commit=spec.commits_before_processing
                )
            finally:
                ledger.close()


@dataclass(frozen=True)
class TaskResult:
    """One output task's outcome for one sink, reported back to the driver."""

    sink: str
    task: str
    attempt: str
    records: int
    accepted: bool
    reason: str = ""


def write_task(
    ref: EpochRef, sink: SinkSpec, task_id: str, attempt: str, rows: Iterable[Mapping[str, Any]]
) -> TaskResult:
    """Stage one output task's rows in one sink and report the pre-commit to the ledger.

    Exactly one attempt per (sink, task) is accepted. An attempt that finds a winner already registered
    writes nothing; one that loses the race at pre-commit, or is fenced (the epoch was aborted or
    re-planned), rolls back its own staging.
    """
    from onceflow.engine.sinks import writer_for

    spec = ref.pipeline
    if spec.commits_before_processing:
        return _write_directly(ref, sink, task_id, attempt, rows)
    ledger = Ledger.connect(ref.ledger_url)
    try:
        if _winner(ledger, spec.name, ref.epoch, sink.name, task_id) not in (None, attempt):
            return TaskResult(sink.name, task_id, attempt, 0, False, LOST_TO_ANOTHER_ATTEMPT)
        writer = writer_for(sink)
        context = TaskContext(
            pipeline=spec.name,
            epoch=ref.epoch,
            slice=ref.slice,
            task=task_id,
            attempt=attempt,
            sink=sink.name,
            inputs=ref.slice_ranges,
            replaces=ref.replaces,
        )
        count = 0
        try:
            writer.begin(context)
            for batch in _batches(rows):
                writer.write(batch)
                count += len(batch)
            committable = writer.pre_commit()
            crash_point("task_after_stage")
        except ConflictingAttempt:
            writer.abort()
            if _winner(ledger, spec.name, ref.epoch, sink.name, task_id) is not None:
                return TaskResult(sink.name, task_id, attempt, 0, False, LOST_TO_ANOTHER_ATTEMPT)
            raise  # the other attempt has not reported yet: let Spark retry this task later
        except BaseException:
            writer.abort()
            raise
        try:
            ledger.register_precommit(committable, ref.attempt_token)
        except LosingAttempt:
            writer.abort()  # a speculative or retried copy that lost the race: roll back its own staging
            return TaskResult(sink.name, task_id, attempt, count, False, LOST_TO_ANOTHER_ATTEMPT)
        except PrecommitRefused as refused:
            writer.abort()
            return TaskResult(sink.name, task_id, attempt, count, False, str(refused))
        crash_point("task_after_precommit")
        return TaskResult(sink.name, task_id, attempt, count, True)
    finally:
        ledger.close()


def _write_directly(
    ref: EpochRef, sink: SinkSpec, task_id: str, attempt: str, rows: Iterable[Mapping[str, Any]]
) -> TaskResult:
    """at_most_once: the epoch is committed already, so rows go straight to a direct sink, unregistered."""
    from onceflow.engine.sinks import writer_for

    writer = writer_for(sink)
    context = TaskContext(
        ref.pipeline.name, ref.epoch, ref.slice, task_id, attempt, sink.name, ref.slice_ranges
    )
    writer.begin(context)
    count = 0
    for batch in _batches(rows):
        writer.write(batch)
        count += len(batch)
    writer.pre_commit()
    return TaskResult(sink.name, task_id, attempt, count, True)


def _batches(rows: Iterable[Mapping[str, Any]]) -> Iterator[list[Mapping[str, Any]]]:
    batch: list[Mapping[str, Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= WRITE_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def _winner(ledger: Ledger, pipeline: str, epoch: int, sink: str, task: str) -> str | None:
    for participant in ledger.participants(pipeline, epoch):
        if participant.sink == sink and participant.task == task:
            return participant.attempt
    return None

"""What the read-path conformance tests share: a topic's ranges and read tasks, each path's rows and
dead letters over them, and the assertion that the paths gave the same ones.

The JSON, nested JSON and Avro conformance tests read one hostile topic with the Python reader and
with the JVM path (`onceflow.engine.jvm_read.jvm_read`), and assert the same rows, the same dead
letters with the same reasons and offsets, each read task's records in offset order, and no record
accepted in the JVM that Python rejects (`assert_conforms`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from onceflow.decoding.records import DeadLetter
from onceflow.engine.jvm_checks import kafka_source_missing
from onceflow.engine.jvm_read import DEAD_LETTER_COLUMN, jvm_read, task_kafka_frame
from onceflow.executor.reading import read_task, split
from onceflow.executor.slices import SliceRef
from onceflow.offsets import OffsetRange
from onceflow.pipeline import Pipeline
from onceflow.sources.kafka_planning import ReadTask

Rows = list[tuple[Any, ...]]


def topic_ranges(bootstrap: str, topic: str, partitions: int = 2) -> list[OffsetRange]:
    """Each partition's committed records, from its low to its high watermark."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "conformance", "isolation.level": "read_committed"}
    )
    try:
        ends = [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in range(partitions)
        ]
    finally:
        consumer.close()
    return [OffsetRange(topic, p, low, high) for p, (low, high) in enumerate(ends)]


def read_tasks(spec: Pipeline, ranges: list[OffsetRange]) -> list[ReadTask]:
    """The ranges cut into read tasks of at most the spec's ``max_records_per_task`` offsets."""
    pieces = [piece for r in ranges for piece in r.split(spec.max_records_per_task)]
    return [ReadTask(f"t{n}", 0, piece) for n, piece in enumerate(pieces)]


def in_offset_order(got: list[Any], offset_at: int) -> list[str]:
    """Each source partition's records, in the order the read gave them, must have rising offsets."""
    last: dict[int, int] = {}
    problems = []
    for row in got:
        if row[DEAD_LETTER_COLUMN] is None:
            partition, offset = row[offset_at - 1], row[offset_at]
        else:
            letter = DeadLetter.from_json(row[DEAD_LETTER_COLUMN])
            partition, offset = letter.partition, letter.offset
        if partition in last and offset <= last[partition]:
            problems.append(f"partition {partition}: offset {offset} after {last[partition]}")
        last[partition] = offset
    return problems


def letter_key(letter: DeadLetter) -> tuple[Any, ...]:
    """What two paths' dead letters must have alike."""
    return (letter.partition, letter.offset, letter.key, letter.value, letter.reason, letter.topic)


def plain(value: Any) -> Any:
    """A Spark Row (structs) as the plain dicts and lists the Python decoder gives."""
    if hasattr(value, "asDict"):
        return {k: plain(v) for k, v in value.asDict().items()}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(plain(v) for v in value)
    return value


def read_in_process(ref: SliceRef, tasks: Sequence[ReadTask]) -> tuple[Rows, list[DeadLetter]]:
    """The Python reader and decoder, task by task, in this process: its rows and dead letters."""
    rows: Rows = []
    dead: list[DeadLetter] = []
    for task in tasks:
        task_rows, task_dead = split(read_task(ref, task))
        rows += task_rows
        dead += task_dead
    return rows, dead


def split_collected(collected: list[Any]) -> tuple[Rows, list[DeadLetter]]:
    """A decoded frame's collected rows apart from its dead letters (the dead-letter column last)."""
    letters = [r[DEAD_LETTER_COLUMN] for r in collected]
    rows = [tuple(r)[:-1] for r, letter in zip(collected, letters, strict=True) if letter is None]
    return rows, [DeadLetter.from_json(letter) for letter in letters if letter is not None]


def assert_same_reads(
    rows: Rows, dead: list[DeadLetter], other_rows: Rows, other_dead: list[DeadLetter]
) -> None:
    """The same rows (as plain values, in place order) and the same dead letters, whatever the order
    the two reads gave them in."""
    offset_at = len(rows[0]) - 2

    def by_place(row: tuple[Any, ...]) -> tuple[Any, ...]:
        return (row[offset_at - 1], row[offset_at])

    assert sorted(map(plain, other_rows), key=by_place) == sorted(map(plain, rows), key=by_place)
    assert sorted(map(letter_key, other_dead)) == sorted(map(letter_key, dead))


@dataclass(frozen=True)
class Conformed:
    """Both reads of a conformance test: the Python path's rows and dead letters, the JVM path's
    collected records in read order, and which records the JVM decoded itself."""

    rows: Rows
    dead: list[DeadLetter]
    got: list[Any]
    accepted: set[tuple[int, int]]


def assert_conforms(
    spark: Any,
    ref: SliceRef,
    tasks: Sequence[ReadTask],
    python: tuple[Rows, list[DeadLetter]],
    *,
    plans: Sequence[Any] = (),
    json_checks: Any = None,
    collect: Callable[[Any], list[Any]] = lambda frame: frame.collect(),
) -> Conformed:
    """Reads ``tasks`` on the JVM path and asserts it gives ``python``'s rows and dead letters: the
    same rows, the same dead letters, in offset order per read task, and no record accepted in the JVM
    that Python rejects. ``plans`` are an Avro format's writer plans; ``collect`` turns a frame into
    rows (e.g. timestamps as exact microseconds)."""
    kafka, missing = kafka_source_missing(lambda: task_kafka_frame(spark, ref.bootstrap, tasks))
    assert missing is None
    frame, checked = jvm_read(kafka, ref, plans, json_checks=json_checks)
    got = collect(frame)  # partition by partition: read task by read task
    accepted = {
        (r["partition"], r["offset"])
        for r in checked.where("_accepted").select("partition", "offset").collect()
    }
    rows, dead = python
    jvm_rows, jvm_dead = split_collected(got)
    assert in_offset_order(got, len(rows[0]) - 2) == []
    assert_same_reads(rows, dead, jvm_rows, jvm_dead)
    assert not accepted & {(d.partition, d.offset) for d in dead}
    return Conformed(rows, dead, got, accepted)

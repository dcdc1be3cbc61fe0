"""Epoch planning: which offsets of which partitions an epoch reads, and which task reads them.

Pure functions over what the ledger and Kafka report, so the rules that keep exactly-once can be tested
exhaustively without a broker:

* a partition with a committed position resumes exactly there (invariant 2);
* a range never goes beyond the last stable offset (LSO), the end a read_committed consumer can see, so
  an epoch never waits on an open transaction and never plans offsets whose fate is undecided;
* a range never spans more than ``max_records_per_partition`` offsets;
* offsets deleted by retention before they were read are an error (`OffsetsLost`) unless the source says
  "skip", and then they are reported, never silently passed over.

The I/O that gathers the inputs lives in `onceflow.sources.kafka_metadata`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from onceflow.offsets import OffsetRange
from onceflow.pipeline import ON_MISSING_OFFSETS, Starting
from onceflow.sources.errors import OffsetsLost, PlanningError, SkippedOffsets

TopicPartitionKey = tuple[str, int]


@dataclass(frozen=True, order=True)
class PartitionOffsets:
    """What Kafka reports for one partition: the earliest stored offset and the last stable offset."""

    topic: str
    partition: int
    low: int
    stable: int

    def __post_init__(self) -> None:
        if self.partition < 0 or self.low < 0 or self.stable < self.low:
            raise ValueError(f"invalid partition offsets {self}")

    @property
    def key(self) -> TopicPartitionKey:
        return (self.topic, self.partition)


@dataclass(frozen=True)
class EpochPlan:
    """An epoch's input: one range per partition (empty ones included, so that every position is kept).

    ``skipped`` lists offsets that retention deleted and the "skip" policy passed over; ``backlog`` counts
    the offsets up to the epoch's target (LSO or interval end) left for later epochs by the maximum;
    ``notes`` are lines for the plan's log about how the ranges were cut.
    """

    ranges: tuple[OffsetRange, ...]
    skipped: tuple[SkippedOffsets, ...] = ()
    backlog: int = 0
    notes: tuple[str, ...] = ()

    @property
    def span(self) -> int:
        return sum(r.span for r in self.ranges)

    @property
    def is_empty(self) -> bool:
        return self.span == 0

    def positions(self) -> dict[TopicPartitionKey, int]:
        """Where each partition stands once this epoch is committed."""
        return {(r.topic, r.partition): r.until_offset for r in self.ranges}


@dataclass(frozen=True)
class ReadTask:
    """One Spark read task: a piece of one partition's range, owned by one slice."""

    task_id: str
    slice: int
    range: OffsetRange


@dataclass(frozen=True)
class SlicePlan:
    """A parallel participant: the whole partitions it owns and the read tasks that cover them."""

    slice: int
    ranges: tuple[OffsetRange, ...]
    tasks: tuple[ReadTask, ...]


def topics_without_positions(topics: Iterable[str], committed: Mapping[TopicPartitionKey, int]) -> list[str]:
    """Topics with no committed position at all: the source's ``starting`` policy applies to them."""
    seen = {topic for topic, _ in committed}
    return sorted(t for t in set(topics) if t not in seen)


def plan_ranges(
    partitions: Iterable[PartitionOffsets],
    committed: Mapping[TopicPartitionKey, int],
    *,
    starting: Starting,
    max_records_per_partition: int,
    on_missing_offsets: str = "fail",
    start_offsets: Mapping[TopicPartitionKey, int] | None = None,
    end_offsets: Mapping[TopicPartitionKey, int] | None = None,
) -> EpochPlan:
    """Plan the next epoch's ranges over ``partitions`` (every current partition of the source's topics).

    ``committed`` holds the positions of the last committed epoch; entries of other topics are ignored.
    ``start_offsets`` are the offsets for the ``starting`` timestamp of the partitions of topics without
    a position, and ``end_offsets`` the offsets for a data interval's end timestamp; in both, -1 means
    "no record at or after that time" and stands for the LSO.
    """
    if isinstance(max_records_per_partition, bool) or max_records_per_partition < 1:
        raise ValueError(f"max_records_per_partition={max_records_per_partition!r}: expected >= 1")
    if on_missing_offsets not in ON_MISSING_OFFSETS:
        raise ValueError(f"on_missing_offsets={on_missing_offsets!r}: expected one of {ON_MISSING_OFFSETS}")
    current = sorted(partitions)
    keys = [p.key for p in current]
    if len(set(keys)) != len(keys):
        raise PlanningError(f"a partition is listed more than once in {keys}")
    topics = {p.topic for p in current}
    _check_committed_partitions_exist(committed, topics, set(keys))
    topics_with_positions = {topic for topic, _ in committed if topic in topics}

    ranges: list[OffsetRange] = []
    lost: list[SkippedOffsets] = []
    skipped: list[SkippedOffsets] = []
    backlog = 0
    for part in current:
        if part.key in committed:
            start = committed[part.key]
            if start > part.stable:
                raise PlanningError(
                    f"{part.topic}[{part.partition}]: committed position {start} is beyond the last stable "
                    f"offset {part.stable}; was the topic deleted and recreated?"
                )
            if start < part.low:
                gap = SkippedOffsets(part.topic, part.partition, start, part.low)
                if on_missing_offsets == "fail":
                    lost.append(gap)
                    continue
                skipped.append(gap)
                start = part.low
        elif part.topic in topics_with_positions:
            start = part.low  # a partition added after the pipeline started: nothing in it may be skipped
        else:
            start = _starting_offset(part, starting, start_offsets)
        target = part.stable
        if end_offsets is not None:
            if part.key not in end_offsets:
                raise PlanningError(f"{part.topic}[{part.partition}]: no offset for the data interval end")
            end = end_offsets[part.key]
            if end >= 0:
                target = min(end, part.stable)
        target = max(target, start)
        until = min(target, start + max_records_per_partition)
        backlog += target - until
        ranges.append(OffsetRange(part.topic, part.partition, start, until))
    if lost:
        raise OffsetsLost(tuple(lost))
    return EpochPlan(ranges=tuple(ranges), skipped=tuple(skipped), backlog=backlog)


def _check_committed_partitions_exist(
    committed: Mapping[TopicPartitionKey, int], topics: set[str], keys: set[TopicPartitionKey]
) -> None:
    vanished = sorted(k for k in committed if k[0] in topics and k not in keys)
    if vanished:
        raise PlanningError(
            f"partitions with a committed position no longer exist: {vanished}; "
            "was a topic deleted and recreated with fewer partitions?"
        )


def _starting_offset(
    part: PartitionOffsets, starting: Starting, start_offsets: Mapping[TopicPartitionKey, int] | None
) -> int:
    if starting == "earliest":
        return part.low
    if starting == "latest":
        return part.stable
    if start_offsets is None or part.key not in start_offsets:
        raise PlanningError(
            f"{part.topic}[{part.partition}]: no offset for the starting timestamp {starting}"
        )
    offset = start_offsets[part.key]
    if offset < 0:
        return part.stable
    return min(max(offset, part.low), part.stable)


def assign_slices(
    ranges: Iterable[OffsetRange], slices: int, max_records_per_task: int
) -> tuple[SlicePlan, ...]:
    """Give each slice whole partitions and cut each slice's ranges into read tasks.

    Partitions are dealt round-robin in sorted (topic, partition) order, so the assignment depends only
    on the epoch's ranges (which the ledger keeps): a retried job recomputes the same slices and task ids
    (``s{slice}-t{i}``). Empty ranges stay with their slice but get no read task.
    """
    if isinstance(slices, bool) or slices < 1:
        raise ValueError(f"slices={slices!r}: expected >= 1")
    if isinstance(max_records_per_task, bool) or max_records_per_task < 1:
        raise ValueError(f"max_records_per_task={max_records_per_task!r}: expected >= 1")
    ordered = sorted(ranges)
    keys = [(r.topic, r.partition) for r in ordered]
    if len(set(keys)) != len(keys):
        raise PlanningError(f"an epoch has one range per partition; repeated in {[str(r) for r in ordered]}")
    owned: list[list[OffsetRange]] = [[] for _ in range(slices)]
    for index, offset_range in enumerate(ordered):
        owned[index % slices].append(offset_range)
    plans = []
    for number, slice_ranges in enumerate(owned):
        pieces = [piece for r in slice_ranges if not r.is_empty for piece in r.split(max_records_per_task)]
        tasks = tuple(ReadTask(f"s{number}-t{i}", number, piece) for i, piece in enumerate(pieces))
        plans.append(SlicePlan(slice=number, ranges=tuple(slice_ranges), tasks=tasks))
    return tuple(plans)

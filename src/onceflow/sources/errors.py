"""Errors of the Kafka source: each names the topic, partition and offsets involved."""

from __future__ import annotations

from dataclasses import dataclass

from onceflow.errors import OnceflowError


@dataclass(frozen=True)
class SkippedOffsets:
    """Offsets a pipeline had to read but that retention deleted: [planned_from, earliest)."""

    topic: str
    partition: int
    planned_from: int
    earliest: int

    @property
    def count(self) -> int:
        return self.earliest - self.planned_from

    def __str__(self) -> str:
        return (
            f"{self.topic}[{self.partition}]: planned offset {self.planned_from}, "
            f"earliest available {self.earliest} ({self.count} offsets deleted)"
        )


class OffsetsLost(OnceflowError):
    """Retention deleted offsets that the pipeline has not read yet.

    Raised instead of silently starting later; set ``on_missing_offsets="skip"`` on the source to accept
    the loss and resume at the earliest available offset.
    """

    def __init__(self, lost: tuple[SkippedOffsets, ...]) -> None:
        self.lost = lost
        first = lost[0]
        self.topic = first.topic
        self.partition = first.partition
        self.planned_offset = first.planned_from
        self.earliest_offset = first.earliest
        super().__init__(
            "offsets deleted by retention before they were read: "
            + "; ".join(str(item) for item in lost)
            + ". Set on_missing_offsets='skip' on the source to resume at the earliest available offset."
        )


class PlanningError(OnceflowError):
    """The ledger's positions and Kafka's partitions contradict each other (e.g. a recreated topic)."""


class TopicNotFound(OnceflowError):
    """A source topic does not exist (the broker may not create topics automatically)."""


class RangeReadError(OnceflowError):
    """An offset range could not be read completely."""


class RangeReadTimeout(RangeReadError):
    """Reading an offset range made no progress for longer than the allowed time."""

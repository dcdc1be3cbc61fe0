"""Offset ranges: the unit the ledger records at plan time and Spark reads exactly."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Records of one partition with from_offset <= offset < until_offset.

    Offsets, not counts, bound a range: transaction control records and aborted records occupy offsets
    but are never delivered to a read_committed consumer, so a range may yield fewer records than it spans.
    """

    topic: str
    partition: int
    from_offset: int
    until_offset: int

    def __post_init__(self) -> None:
        if self.partition < 0 or self.from_offset < 0 or self.until_offset < self.from_offset:
            raise ValueError(f"invalid offset range {self}")

    @property
    def span(self) -> int:
        return self.until_offset - self.from_offset

    @property
    def is_empty(self) -> bool:
        return self.until_offset == self.from_offset

    def split(self, max_span: int) -> list[OffsetRange]:
        """Cut into consecutive ranges of at most max_span offsets, for parallel Spark read tasks."""
        if max_span <= 0:
            raise ValueError("max_span must be positive")
        if self.is_empty:
            return [self]
        return [
            OffsetRange(self.topic, self.partition, start, min(start + max_span, self.until_offset))
            for start in range(self.from_offset, self.until_offset, max_span)
        ]

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]@[{self.from_offset},{self.until_offset})"

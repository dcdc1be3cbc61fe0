"""What every task of a slice knows about its epoch: small, because it travels in each task's closure."""

from __future__ import annotations

from dataclasses import dataclass, field

from onceflow.config import Settings
from onceflow.offsets import OffsetRange
from onceflow.pipeline import Pipeline


@dataclass(frozen=True)
class SliceRef:
    """One slice of one epoch, as its tasks see it; no ledger URL or token: tasks never touch the ledger."""

    pipeline: Pipeline
    epoch: int
    slice: int
    slice_ranges: tuple[OffsetRange, ...]
    bootstrap: str
    replaces: tuple[int, ...] = ()  # committed epochs of the same interval whose output this one replaces
    # The deployment's settings, which fill sink configs' defaults (the Kafka bootstrap, the DSN...).
    settings: Settings = field(kw_only=True)

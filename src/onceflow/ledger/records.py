"""What the ledger returns: immutable snapshots of its rows, safe to pass between processes and threads."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from onceflow.committables import Committable
from onceflow.decoding.records import DeadLetter
from onceflow.ledger.models import EpochStatus, ParticipantStatus
from onceflow.offsets import OffsetRange


def where(pipeline: str, number: int) -> str:
    """How every message names an epoch, so the ledger's refusals and the coordinator's read alike."""
    return f"epoch {number} of pipeline {pipeline!r}"


@dataclass(frozen=True)
class Epoch:
    pipeline: str
    number: int
    status: EpochStatus
    attempt_token: str
    ranges: tuple[OffsetRange, ...]
    expected: tuple[tuple[str, str], ...]
    planned_at: datetime
    run_id: str | None = None
    data_interval_start: datetime | None = None
    data_interval_end: datetime | None = None
    decided_at: datetime | None = None
    finished_at: datetime | None = None
    abort_reason: str | None = None
    owner: str | None = None
    lease_expires_at: datetime | None = None

    @property
    def is_final(self) -> bool:
        return self.status.is_final

    @property
    def sinks(self) -> tuple[str, ...]:
        return tuple(sorted({sink for sink, _ in self.expected}))

    @property
    def where(self) -> str:
        """The epoch's name in messages (`where`), without its status."""
        return where(self.pipeline, self.number)

    def __str__(self) -> str:
        return f"{self.where} ({self.status})"


@dataclass(frozen=True)
class Participant:
    pipeline: str
    epoch: int
    sink: str
    task: str
    slice: int
    attempt: str
    status: ParticipantStatus
    committable: Committable
    staged_location: str | None
    record_count: int
    checksum: str
    precommitted_at: datetime
    finished_at: datetime | None = None


@dataclass(frozen=True)
class StoredDeadLetter:
    pipeline: str
    epoch: int
    letter: DeadLetter
    created_at: datetime

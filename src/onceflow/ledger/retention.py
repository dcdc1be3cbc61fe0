"""Ledger retention: delete what no protocol step can still need, so the ledger stops growing.

A pipeline adds an epoch row, one offset row per input partition and one participant row per (sink, task)
every epoch, for ever; Flink bounds its checkpoints the same way (``state.checkpoints.num-retained``).
What goes, per pipeline:

- final epochs (COMMITTED or ABORTED) older than the ``keep_epochs`` most recent COMMITTED epochs, with
  their offsets, participants and dead letters;
- dead letters older than ``dead_letter_age`` whose epoch is final.

What stays, however old (each would change what a step decides if it went):

- every epoch that is not final (invariant 1's one epoch in flight, which recover finishes);
- per input partition, the newest committed epoch whose range ends at the partition's position: the next
  plan starts there (invariant 2), also for a partition the source no longer reads this week;
- the epochs of the data interval the epoch in flight covers (a replacement re-run reads them to know
  whose output it replaces);
- epochs with dead letters younger than ``dead_letter_age`` (an operator reads them by epoch).

Each batch is one short transaction that first locks the pipeline's row, as planning does, so no epoch is
planned while the batch decides and deletes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import and_, delete, func, select
from sqlalchemy.orm import Session

from onceflow.ledger.models import (
    OPEN_STATUSES,
    DeadLetterRow,
    EpochOffsetRow,
    EpochRow,
    EpochStatus,
    ParticipantRow,
    PipelineRow,
    utcnow,
)

FINAL = (EpochStatus.COMMITTED.value, EpochStatus.ABORTED.value)
# The tables retention deletes from and counts, by the name results report them under.
MODELS: dict[str, type[EpochRow] | type[EpochOffsetRow] | type[ParticipantRow] | type[DeadLetterRow]] = {
    "epochs": EpochRow,
    "epoch_offsets": EpochOffsetRow,
    "participants": ParticipantRow,
    "dead_letters": DeadLetterRow,
}
KINDS = tuple(MODELS)

# Opens one short transaction (`Ledger._tx`): retention runs many, so no batch holds locks for long.
Transaction = Callable[[], AbstractContextManager[Session]]


@dataclass(frozen=True)
class RetentionPolicy:
    """How much history a pipeline keeps in the ledger."""

    keep_epochs: int
    dead_letter_age: timedelta
    batch_epochs: int = 20  # epochs deleted per transaction (with their offsets and participants)
    batch_rows: int = 1000  # dead-letter rows deleted per transaction

    def __post_init__(self) -> None:
        if isinstance(self.keep_epochs, bool) or self.keep_epochs < 1:
            raise ValueError(f"keep_epochs={self.keep_epochs!r}: keep at least the last committed epoch")
        if self.dead_letter_age < timedelta(0):
            raise ValueError(f"dead_letter_age={self.dead_letter_age!r}: expected a duration >= 0")
        if self.batch_epochs < 1 or self.batch_rows < 1:
            raise ValueError(f"batches of {self.batch_epochs} epochs / {self.batch_rows} rows: expected >= 1")


@dataclass
class RetentionResult:
    """Rows deleted per kind, the oldest committed epoch kept whole, and how many older ones stayed."""

    pipeline: str
    deleted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    oldest_kept: int | None = None
    held_back: int = 0  # final epochs older than the kept ones that stay because a step needs them
    batches: int = 0

    def add(self, kind: str, rows: int) -> None:
        self.deleted[kind] += rows

    @property
    def total(self) -> int:
        return sum(self.deleted.values())

    def lines(self) -> list[str]:
        """One line per kind of row, then what was kept, for a terminal or a task log."""
        kept = (
            f"epochs from {self.oldest_kept} on kept whole"
            if self.oldest_kept is not None
            else "fewer committed epochs than kept: no epoch deleted"
        )
        held = f", {self.held_back} older epoch(s) kept as still needed" if self.held_back else ""
        return [
            *(f"{kind}: {rows} rows deleted" for kind, rows in self.deleted.items()),
            f"pipeline {self.pipeline!r}: {kept}{held}",
        ]


def _count(result: object) -> int:
    return int(getattr(result, "rowcount", 0) or 0)


def lock_pipeline(s: Session, pipeline: str) -> bool:
    """Take the pipeline's row lock (plan_epoch takes it too); False for an unknown pipeline."""
    return s.get(PipelineRow, pipeline, with_for_update=True) is not None


def oldest_kept(s: Session, pipeline: str, keep_epochs: int) -> int | None:
    """The number of the ``keep_epochs``-th most recent COMMITTED epoch (None: fewer committed)."""
    return s.scalar(
        select(EpochRow.epoch)
        .where(EpochRow.pipeline == pipeline, EpochRow.status == EpochStatus.COMMITTED.value)
        .order_by(EpochRow.epoch.desc())
        .offset(keep_epochs - 1)
        .limit(1)
    )


def position_holders(s: Session, pipeline: str, below: int) -> set[int]:
    """Committed epochs older than ``below`` that hold a partition's position: per (topic, partition),
    the newest committed epoch whose range ends at the furthest committed offset."""
    committed = and_(
        EpochRow.pipeline == EpochOffsetRow.pipeline,
        EpochRow.epoch == EpochOffsetRow.epoch,
        EpochRow.status == EpochStatus.COMMITTED.value,
    )
    positions = (
        select(
            EpochOffsetRow.topic,
            EpochOffsetRow.partition,
            func.max(EpochOffsetRow.until_offset).label("position"),
        )
        .join(EpochRow, committed)
        .where(EpochOffsetRow.pipeline == pipeline)
        .group_by(EpochOffsetRow.topic, EpochOffsetRow.partition)
        .subquery()
    )
    holders = (
        select(func.max(EpochOffsetRow.epoch))
        .join(EpochRow, committed)
        .join(
            positions,
            and_(
                positions.c.topic == EpochOffsetRow.topic,
                positions.c.partition == EpochOffsetRow.partition,
                positions.c.position == EpochOffsetRow.until_offset,
            ),
        )
        .where(EpochOffsetRow.pipeline == pipeline)
        .group_by(EpochOffsetRow.topic, EpochOffsetRow.partition)
    )
    return {int(n) for n in s.scalars(holders).all() if n is not None and n < below}


def needed_now(s: Session, pipeline: str, below: int, young_since: datetime) -> set[int]:
    """Epochs older than ``below`` that the epoch in flight or young dead letters need, read inside the
    batch's own transaction (after the pipeline lock) because a plan can change them."""
    needed: set[int] = set()
    in_flight = s.execute(
        select(EpochRow.data_interval_start, EpochRow.data_interval_end).where(
            EpochRow.pipeline == pipeline, EpochRow.status.in_([st.value for st in OPEN_STATUSES])
        )
    ).first()
    if in_flight is not None and in_flight[0] is not None and in_flight[1] is not None:
        needed.update(
            s.scalars(
                select(EpochRow.epoch).where(
                    EpochRow.pipeline == pipeline,
                    EpochRow.epoch < below,
                    EpochRow.data_interval_start == in_flight[0],
                    EpochRow.data_interval_end == in_flight[1],
                )
            ).all()
        )
    needed.update(
        s.scalars(
            select(DeadLetterRow.epoch)
            .where(
                DeadLetterRow.pipeline == pipeline,
                DeadLetterRow.epoch < below,
                DeadLetterRow.created_at >= young_since,
            )
            .distinct()
        ).all()
    )
    return needed


def delete_epochs(s: Session, pipeline: str, numbers: Iterable[int], result: RetentionResult) -> None:
    """Delete final epochs and every row that refers to them (children first: foreign keys)."""
    batch = sorted(set(numbers))
    if not batch:
        return
    children = (
        ("epoch_offsets", EpochOffsetRow),
        ("participants", ParticipantRow),
        ("dead_letters", DeadLetterRow),
    )
    for kind, model in children:
        result.add(
            kind,
            _count(
                s.execute(
                    delete(model)
                    .where(model.pipeline == pipeline, model.epoch.in_(batch))
                    .execution_options(synchronize_session=False)
                )
            ),
        )
    result.add(
        "epochs",
        _count(
            s.execute(
                delete(EpochRow)
                .where(EpochRow.pipeline == pipeline, EpochRow.epoch.in_(batch), EpochRow.status.in_(FINAL))
                .execution_options(synchronize_session=False)
            )
        ),
    )


def old_epochs_batch(s: Session, pipeline: str, below: int, protected: set[int], limit: int) -> list[int]:
    """Up to ``limit`` final epochs older than ``below`` and not protected, oldest first."""
    stmt = (
        select(EpochRow.epoch)
        .where(EpochRow.pipeline == pipeline, EpochRow.epoch < below, EpochRow.status.in_(FINAL))
        .order_by(EpochRow.epoch)
    )
    if protected:
        stmt = stmt.where(EpochRow.epoch.not_in(sorted(protected)))
    return [int(n) for n in s.scalars(stmt.limit(limit)).all()]


def old_dead_letters_batch(s: Session, pipeline: str, older_than: datetime, limit: int) -> list[int]:
    """Ids of dead letters created before ``older_than`` whose epoch is final."""
    return [
        int(i)
        for i in s.scalars(
            select(DeadLetterRow.id)
            .join(
                EpochRow,
                and_(EpochRow.pipeline == DeadLetterRow.pipeline, EpochRow.epoch == DeadLetterRow.epoch),
            )
            .where(
                DeadLetterRow.pipeline == pipeline,
                DeadLetterRow.created_at < older_than,
                EpochRow.status.in_(FINAL),
            )
            .order_by(DeadLetterRow.id)
            .limit(limit)
        ).all()
    ]


def delete_dead_letters(s: Session, ids: list[int]) -> int:
    if not ids:
        return 0
    return _count(
        s.execute(
            delete(DeadLetterRow)
            .where(DeadLetterRow.id.in_(ids))
            .execution_options(synchronize_session=False)
        )
    )


def held_back(s: Session, pipeline: str, below: int) -> int:
    """Final epochs older than ``below`` that are still there: the ones a step still needs."""
    return int(
        s.scalar(
            select(func.count())
            .select_from(EpochRow)
            .where(EpochRow.pipeline == pipeline, EpochRow.epoch < below, EpochRow.status.in_(FINAL))
        )
        or 0
    )


def retain(
    tx: Transaction, pipeline: str, policy: RetentionPolicy, *, now: datetime | None = None
) -> RetentionResult:
    """Delete the pipeline's history that no step can still need (see this module's docstring).

    1. Find the oldest of the ``keep_epochs`` most recent committed epochs and the epochs holding a
       partition's position (these only loosen as epochs commit, so reading them once is safe).
    2. Delete older final epochs with their rows, oldest first, ``batch_epochs`` per transaction;
       each transaction locks the pipeline and reads again what the epoch in flight and young dead
       letters need.
    3. Delete dead letters older than ``dead_letter_age`` of final epochs, ``batch_rows`` per
       transaction.
    """
    now = now or utcnow()
    young_since = now - policy.dead_letter_age
    result = RetentionResult(pipeline)
    # 1.
    with tx() as s:
        below = oldest_kept(s, pipeline, policy.keep_epochs)
        stable = set() if below is None else position_holders(s, pipeline, below)
    # 2.
    if below is not None:
        result.oldest_kept = below
        while True:
            with tx() as s:
                if not lock_pipeline(s, pipeline):
                    break
                protected = stable | needed_now(s, pipeline, below, young_since)
                batch = old_epochs_batch(s, pipeline, below, protected, policy.batch_epochs)
                delete_epochs(s, pipeline, batch, result)
            result.batches += bool(batch)
            if len(batch) < policy.batch_epochs:
                break
        with tx() as s:
            result.held_back = held_back(s, pipeline, below)
    # 3.
    while True:
        with tx() as s:
            if not lock_pipeline(s, pipeline):
                break
            ids = old_dead_letters_batch(s, pipeline, young_since, policy.batch_rows)
            result.add("dead_letters", delete_dead_letters(s, ids))
        result.batches += bool(ids)
        if len(ids) < policy.batch_rows:
            break
    return result


def row_counts(s: Session, pipeline: str | None = None) -> dict[str, int]:
    """Rows per ledger table (of one pipeline if given): what retention keeps bounded."""
    counts: dict[str, int] = {}
    for kind, model in MODELS.items():
        stmt = select(func.count()).select_from(model)
        if pipeline is not None:
            stmt = stmt.where(model.pipeline == pipeline)
        counts[kind] = int(s.scalar(stmt) or 0)
    return counts


__all__ = ["KINDS", "RetentionPolicy", "RetentionResult"]

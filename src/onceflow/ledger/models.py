"""The ledger's tables as SQLAlchemy 2 models; the migrations in `migrations/versions` create them.

Natural keys are primary keys on purpose: (pipeline, epoch) makes two concurrent planners of the same
epoch collide, (pipeline, epoch, sink, task) makes two attempts of the same task collide, so the
database itself lets only one of them win. A partial unique index allows at most one non-final epoch per
pipeline (invariant 1) even if application code were wrong.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class EpochStatus(enum.StrEnum):
    PLANNED = "PLANNED"
    COMMITTING = "COMMITTING"
    COMMITTED = "COMMITTED"
    ABORTING = "ABORTING"
    ABORTED = "ABORTED"

    @property
    def is_final(self) -> bool:
        return self in (EpochStatus.COMMITTED, EpochStatus.ABORTED)


class ParticipantStatus(enum.StrEnum):
    PRECOMMITTED = "PRECOMMITTED"
    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"


OPEN_STATUSES = (EpochStatus.PLANNED, EpochStatus.COMMITTING, EpochStatus.ABORTING)
_OPEN_SQL = "status IN ('PLANNED', 'COMMITTING', 'ABORTING')"


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC timestamps on both backends (SQLite stores them without a zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: the ledger stores timezone-aware timestamps")
        return value.astimezone(UTC)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(
        naming_convention={
            "pk": "pk_%(table_name)s",
            "fk": "fk_%(table_name)s_%(referred_table_name)s",
            "ix": "ix_%(table_name)s_%(column_0_name)s",
            "uq": "uq_%(table_name)s_%(column_0_name)s",
        }
    )


class PipelineRow(Base):
    __tablename__ = "pipelines"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # The row type text (`onceflow.schemas`) of the records the last planned epoch read; deferred, so
    # that planning reads and writes a pipeline's row the same on a ledger of any revision.
    reader_schema: Mapped[str | None] = mapped_column(Text, nullable=True, deferred=True)


class EpochRow(Base):
    __tablename__ = "epochs"
    __table_args__ = (
        ForeignKeyConstraint(["pipeline"], ["pipelines.name"]),
        Index(
            "uq_epochs_one_open_per_pipeline",
            "pipeline",
            unique=True,
            sqlite_where=text(_OPEN_SQL),
            postgresql_where=text(_OPEN_SQL),
        ),
        Index("ix_epochs_interval", "pipeline", "data_interval_start", "data_interval_end"),
        Index("ix_epochs_run", "pipeline", "run_id"),
    )

    pipeline: Mapped[str] = mapped_column(String(100), primary_key=True)
    epoch: Mapped[int] = mapped_column(BigInteger().with_variant(Integer(), "sqlite"), primary_key=True)
    status: Mapped[str] = mapped_column(String(16))
    run_id: Mapped[str | None] = mapped_column(String(250))
    attempt_token: Mapped[str] = mapped_column(String(64))
    data_interval_start: Mapped[datetime | None] = mapped_column(UTCDateTime())
    data_interval_end: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # JSON list of [sink, task] pairs, sorted, so that it compares and prints stably.
    expected_participants: Mapped[str] = mapped_column(Text)
    planned_at: Mapped[datetime] = mapped_column(UTCDateTime())
    decided_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    abort_reason: Mapped[str | None] = mapped_column(Text)
    # Who runs the epoch in flight, and until when it counts as alive without a renewal.
    owner: Mapped[str | None] = mapped_column(Text)
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class EpochOffsetRow(Base):
    __tablename__ = "epoch_offsets"
    __table_args__ = (ForeignKeyConstraint(["pipeline", "epoch"], ["epochs.pipeline", "epochs.epoch"]),)

    pipeline: Mapped[str] = mapped_column(String(100), primary_key=True)
    epoch: Mapped[int] = mapped_column(BigInteger().with_variant(Integer(), "sqlite"), primary_key=True)
    topic: Mapped[str] = mapped_column(String(249), primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    from_offset: Mapped[int] = mapped_column(BigInteger)
    until_offset: Mapped[int] = mapped_column(BigInteger)


class ParticipantRow(Base):
    __tablename__ = "participants"
    __table_args__ = (ForeignKeyConstraint(["pipeline", "epoch"], ["epochs.pipeline", "epochs.epoch"]),)

    pipeline: Mapped[str] = mapped_column(String(100), primary_key=True)
    epoch: Mapped[int] = mapped_column(BigInteger().with_variant(Integer(), "sqlite"), primary_key=True)
    sink: Mapped[str] = mapped_column(String(100), primary_key=True)
    task: Mapped[str] = mapped_column(String(100), primary_key=True)
    slice: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[str] = mapped_column(String(100))
    attempt_token: Mapped[str] = mapped_column(String(64))
    committable: Mapped[str] = mapped_column(Text)
    staged_location: Mapped[str | None] = mapped_column(Text)
    record_count: Mapped[int] = mapped_column(BigInteger)
    checksum: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16))
    precommitted_at: Mapped[datetime] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class DeadLetterRow(Base):
    __tablename__ = "dead_letters"
    __table_args__ = (
        ForeignKeyConstraint(["pipeline", "epoch"], ["epochs.pipeline", "epochs.epoch"]),
        Index("uq_dead_letters_record", "pipeline", "epoch", "topic", "partition", "offset", unique=True),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    pipeline: Mapped[str] = mapped_column(String(100))
    epoch: Mapped[int] = mapped_column(BigInteger().with_variant(Integer(), "sqlite"))
    topic: Mapped[str] = mapped_column(String(249))
    partition: Mapped[int] = mapped_column(Integer)
    offset: Mapped[int] = mapped_column(BigInteger)
    key: Mapped[bytes | None] = mapped_column(LargeBinary)
    reason: Mapped[str] = mapped_column(Text)
    value: Mapped[bytes | None] = mapped_column(LargeBinary)
    # The record's whole key and value sizes, when the letter keeps less (None: kept whole).
    key_size: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    value_size: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())

"""A pipeline's dead letters in the ledger: kept with a slice's pre-commits, counted, read back, paged.

Counting never reads a payload (`count`, `total_with`): an epoch's report, its metrics and the console
count in SQL, and whole letters are read a page at a time (`stored` with ``limit``).

A page lists committed dead letters, filtered, counted and paged in the database. It shows each letter's
position, reason and the previews of its key and value; it reads only a prefix of each payload (enough
for the preview) and its size, never the whole payload, and only the rows of the page. Filters: the
epoch, the reason's code (the text before its first ``:``) and a text searched (case-insensitively for
ASCII) in the position ``topic[partition]@offset``, the reason and the start of the value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import String, and_, case, cast, func, or_, select
from sqlalchemy.orm import Session

from onceflow.decoding.records import DeadLetter
from onceflow.ledger.models import DeadLetterRow, EpochRow, EpochStatus, utcnow
from onceflow.ledger.records import StoredDeadLetter

# Bytes of a key or value read for its preview: 4 per character of `dead_letters.PREVIEW_CHARS` (60),
# plus one character, so that a prefix cut inside a character still shows every previewed character.
PREFIX_BYTES = 244


@dataclass(frozen=True)
class DeadLetterSummary:
    """One dead letter as a list shows it: the start of its key and value, and their whole sizes."""

    epoch: int
    topic: str
    partition: int
    offset: int
    reason: str
    key_prefix: bytes | None
    key_size: int | None
    value_prefix: bytes | None
    value_size: int | None
    created_at: datetime
    value_kept: int | None = None  # bytes of the value the letter keeps (its prefix may be shorter)

    @property
    def code(self) -> str:
        return self.reason.partition(":")[0]


@dataclass(frozen=True)
class DeadLetterPage:
    """``letters``: the page, newest epoch first; ``total``: every match; ``codes``: the matches' codes."""

    letters: list[DeadLetterSummary]
    total: int
    codes: list[str]


def add(s: Session, pipeline: str, number: int, letters: Sequence[DeadLetter]) -> int:
    """Keep records that failed to decode or transform, skipping those kept already (a retried slice).
    They are listed only once the epoch commits: an aborted epoch is replayed and reports them again."""
    if not letters:
        return 0
    have = {
        (t, p, o)
        for t, p, o in s.execute(
            select(DeadLetterRow.topic, DeadLetterRow.partition, DeadLetterRow.offset).where(
                DeadLetterRow.pipeline == pipeline, DeadLetterRow.epoch == number
            )
        ).all()
    }
    now = utcnow()
    added = 0
    for d in letters:
        if (d.topic, d.partition, d.offset) in have:
            continue
        have.add((d.topic, d.partition, d.offset))
        s.add(
            DeadLetterRow(
                pipeline=pipeline,
                epoch=number,
                topic=d.topic,
                partition=d.partition,
                offset=d.offset,
                key=d.key,
                reason=d.reason,
                value=d.value,
                key_size=d.key_size,
                value_size=d.value_size,
                created_at=now,
            )
        )
        added += 1
    return added


def total_with(s: Session, pipeline: str, number: int, letters: Sequence[DeadLetter]) -> int:
    """How many dead letters epoch ``number`` holds once ``letters`` are added: those kept already (by
    other slices, or by an earlier run of this one) plus the new ones. Reads positions, no payload."""
    have = {
        (t, p, o)
        for t, p, o in s.execute(
            select(DeadLetterRow.topic, DeadLetterRow.partition, DeadLetterRow.offset).where(
                DeadLetterRow.pipeline == pipeline, DeadLetterRow.epoch == number
            )
        ).all()
    }
    return len(have | {(d.topic, d.partition, d.offset) for d in letters})


def _scope(stmt: Any, pipeline: str, epoch: int | None, include_uncommitted: bool) -> Any:
    """``stmt`` narrowed to the pipeline's dead letters (one epoch's if given), committed epochs' only
    unless ``include_uncommitted``."""
    stmt = stmt.where(DeadLetterRow.pipeline == pipeline)
    if epoch is not None:
        stmt = stmt.where(DeadLetterRow.epoch == epoch)
    if not include_uncommitted:
        stmt = stmt.join(
            EpochRow,
            (EpochRow.pipeline == DeadLetterRow.pipeline) & (EpochRow.epoch == DeadLetterRow.epoch),
        ).where(EpochRow.status == EpochStatus.COMMITTED.value)
    return stmt


def count(s: Session, pipeline: str, *, epoch: int | None = None, include_uncommitted: bool = False) -> int:
    """How many dead letters `stored` would return, counted in the database."""
    stmt = _scope(select(func.count()).select_from(DeadLetterRow), pipeline, epoch, include_uncommitted)
    return int(s.execute(stmt).scalar_one())


def stored(
    s: Session,
    pipeline: str,
    *,
    epoch: int | None = None,
    include_uncommitted: bool = False,
    limit: int | None = None,
    offset: int = 0,
) -> list[StoredDeadLetter]:
    """Whole dead letters with their payloads, in position order; committed epochs' only unless asked;
    at most ``limit`` of them from ``offset`` on."""
    stmt = _scope(select(DeadLetterRow), pipeline, epoch, include_uncommitted).order_by(
        DeadLetterRow.epoch, DeadLetterRow.topic, DeadLetterRow.partition, DeadLetterRow.offset
    )
    if limit is not None:
        stmt = stmt.limit(limit)
    if offset:
        stmt = stmt.offset(offset)
    return [
        StoredDeadLetter(
            pipeline=r.pipeline,
            epoch=r.epoch,
            letter=DeadLetter(
                r.topic, r.partition, r.offset, r.key, r.value, r.reason, r.key_size, r.value_size
            ),
            created_at=r.created_at,
        )
        for r in s.scalars(stmt).all()
    ]


def _code(dialect: str) -> Any:
    reason = DeadLetterRow.reason
    if dialect == "postgresql":
        return func.split_part(reason, ":", 1)
    colon = func.instr(reason, ":")
    return case((colon > 0, func.substr(reason, 1, colon - 1)), else_=reason)


def _value_text(dialect: str) -> Any:
    """The value's first bytes as text that LIKE can search (non-UTF-8 bytes escaped on PostgreSQL)."""
    if dialect == "postgresql":
        return func.encode(func.substring(DeadLetterRow.value, 1, PREFIX_BYTES), "escape")
    return cast(func.substr(DeadLetterRow.value, 1, PREFIX_BYTES), String)


def page(
    s: Session,
    dialect: str,
    pipeline: str,
    *,
    epoch: int | None = None,
    code: str | None = None,
    text: str | None = None,
    limit: int = 200,
    offset: int = 0,
    oldest_first: bool = False,
) -> DeadLetterPage:
    """The page: newest epoch first (the console), or oldest first (``onceflow dead-letters``)."""
    d = DeadLetterRow
    where = [
        d.pipeline == pipeline,
        EpochRow.status == EpochStatus.COMMITTED.value,
    ]
    if epoch is not None:
        where.append(d.epoch == epoch)
    if code:
        where.append(or_(d.reason == code, d.reason.startswith(code + ":", autoescape=True)))
    needle = (text or "").strip().lower()
    if needle:
        position = d.topic + "[" + cast(d.partition, String) + "]@" + cast(d.offset, String)
        where.append(
            or_(
                *(
                    func.lower(column).contains(needle, autoescape=True)
                    for column in (position, d.reason, func.coalesce(_value_text(dialect), ""))
                )
            )
        )
    joined = and_(EpochRow.pipeline == d.pipeline, EpochRow.epoch == d.epoch)
    code_of = _code(dialect).label("code")
    counts = s.execute(
        select(code_of, func.count()).select_from(d).join(EpochRow, joined).where(*where).group_by(code_of)
    ).all()
    rows = s.execute(
        select(
            d.epoch,
            d.topic,
            d.partition,
            d.offset,
            d.reason,
            func.substr(d.key, 1, PREFIX_BYTES),
            func.coalesce(d.key_size, func.length(d.key)),  # the record's size, when the letter keeps less
            func.substr(d.value, 1, PREFIX_BYTES),
            func.coalesce(d.value_size, func.length(d.value)),
            d.created_at,
            func.length(d.value),
        )
        .join(EpochRow, joined)
        .where(*where)
        .order_by(d.epoch if oldest_first else d.epoch.desc(), d.topic, d.partition, d.offset)
        .limit(limit)
        .offset(offset)
    ).all()
    letters = [
        DeadLetterSummary(
            epoch=r[0],
            topic=r[1],
            partition=r[2],
            offset=r[3],
            reason=r[4],
            key_prefix=None if r[5] is None else bytes(r[5]),
            key_size=r[6],
            value_prefix=None if r[7] is None else bytes(r[7]),
            value_size=r[8],
            created_at=r[9],
            value_kept=r[10],
        )
        for r in rows
    ]
    return DeadLetterPage(letters, sum(n for _, n in counts), sorted(str(c) for c, _ in counts))

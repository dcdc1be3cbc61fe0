"""The ledger: a store of epochs, offsets, participants and dead letters.

It knows tables and compare-and-set transitions, nothing of sinks or committers: the coordinator
(`onceflow.protocol.coordinator`) drives the protocol through it, and Spark executors never touch it (their
driver registers a slice's pre-commits in one transaction).

Epoch status moves ``PLANNED -> COMMITTING -> COMMITTED`` or ``PLANNED -> ABORTING -> ABORTED``. Every
transition is a compare-and-set (``UPDATE ... WHERE status = :expected``, rowcount checked) in its own short
transaction, taken after locking the epoch row (``SELECT ... FOR UPDATE`` on PostgreSQL, ``BEGIN IMMEDIATE``
on SQLite), so a cleared Airflow task, a retry and a concurrent manual action can never both win. Whatever
is refused raises a typed error naming the pipeline, the epoch, its status and the reason.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from onceflow.committables import Committable
from onceflow.decoding.records import DeadLetter
from onceflow.ledger import dead_letter_pages, retention, schema
from onceflow.ledger.errors import (
    EpochInFlight,
    EpochNotPlanned,
    IllegalTransition,
    InvalidPlan,
    LedgerError,
    OffsetGap,
    ParticipantsMissing,
    Refused,
    StaleAttemptToken,
    UnexpectedParticipant,
    UnknownEpoch,
)
from onceflow.ledger.models import (
    OPEN_STATUSES,
    EpochOffsetRow,
    EpochRow,
    EpochStatus,
    ParticipantRow,
    ParticipantStatus,
    PipelineRow,
    utcnow,
)
from onceflow.ledger.records import Epoch, Participant, StoredDeadLetter, where
from onceflow.ledger.refusals import abort_refusal, commit_refusal
from onceflow.ledger.retention import RetentionPolicy, RetentionResult
from onceflow.offsets import OffsetRange


@dataclass(frozen=True)
class _Outcome:
    """One of an epoch's two ways out of PLANNED, as its decision, its marks and its finish see it."""

    decided: EpochStatus
    final: EpochStatus
    participants: ParticipantStatus
    doing: str


_COMMIT = _Outcome(EpochStatus.COMMITTING, EpochStatus.COMMITTED, ParticipantStatus.COMMITTED, "committing")
_ABORT = _Outcome(EpochStatus.ABORTING, EpochStatus.ABORTED, ParticipantStatus.ABORTED, "aborting")
_DECIDED_FOR_COMMIT = (_COMMIT.decided.value, _COMMIT.final.value)
# Handle keys that name where a committable's output is staged, in the order they are looked up.
_LOCATION_KEYS = ("location", "path", "gid", "transactional_id")


def staged_location(committable: Committable) -> str | None:
    """Where the committable's output is staged, for people reading the ledger (None if not named)."""
    for key in _LOCATION_KEYS:
        value = committable.handle.get(key)
        if value is not None:
            return str(value)
    return None


@dataclass(frozen=True)
class Registration:
    """What `Ledger.precommit_slice` did: the participants it holds now, and the attempts that lost."""

    accepted: tuple[Participant, ...]
    lost: tuple[Committable, ...]
    dead_letters_added: int


class Ledger:
    """Durable epoch state of every pipeline; thread-safe, and safe to use from many processes at once."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @classmethod
    def connect(cls, url: str, *, check: bool = True) -> Ledger:
        """Open the ledger at ``url``; unless ``check`` is False, require the schema to be at head."""
        ledger = cls(schema.make_engine(url))
        try:
            schema.probe(ledger.engine)
        except BaseException:
            ledger.close()
            raise
        if check:
            try:
                schema.check_schema(ledger.engine)
            except BaseException:
                ledger.close()
                raise
        return ledger

    def upgrade(self) -> None:
        """Create or migrate the schema (alembic upgrade head)."""
        schema.upgrade(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        return schema.shown_url(self.engine)  # for messages: no password in any form

    @contextmanager
    def _tx(self) -> Iterator[Session]:
        with Session(self.engine, expire_on_commit=False) as session, session.begin():
            yield session

    # ----------------------------------------------------------------------------------------- reads

    def _epoch_row(self, s: Session, pipeline: str, number: int, *, lock: str | None = None) -> EpochRow:
        stmt = select(EpochRow).where(EpochRow.pipeline == pipeline, EpochRow.epoch == number)
        if lock is not None:
            stmt = stmt.with_for_update(read=lock == "share")
        row = s.scalars(stmt).one_or_none()
        if row is None:
            raise UnknownEpoch(f"pipeline {pipeline!r} has no epoch {number}")
        return row

    def _to_epoch(self, s: Session, row: EpochRow) -> Epoch:
        offsets = s.scalars(
            select(EpochOffsetRow)
            .where(EpochOffsetRow.pipeline == row.pipeline, EpochOffsetRow.epoch == row.epoch)
            .order_by(EpochOffsetRow.topic, EpochOffsetRow.partition)
        ).all()
        return self._build_epoch(row, offsets)

    @staticmethod
    def _build_epoch(row: EpochRow, offsets: Sequence[EpochOffsetRow]) -> Epoch:
        return Epoch(
            pipeline=row.pipeline,
            number=row.epoch,
            status=EpochStatus(row.status),
            attempt_token=row.attempt_token,
            ranges=tuple(OffsetRange(o.topic, o.partition, o.from_offset, o.until_offset) for o in offsets),
            expected=tuple((str(a), str(b)) for a, b in json.loads(row.expected_participants)),
            planned_at=row.planned_at,
            run_id=row.run_id,
            data_interval_start=row.data_interval_start,
            data_interval_end=row.data_interval_end,
            decided_at=row.decided_at,
            finished_at=row.finished_at,
            abort_reason=row.abort_reason,
            owner=row.owner,
            lease_expires_at=row.lease_expires_at,
        )

    @staticmethod
    def _to_participant(row: ParticipantRow) -> Participant:
        return Participant(
            pipeline=row.pipeline,
            epoch=row.epoch,
            sink=row.sink,
            task=row.task,
            slice=row.slice,
            attempt=row.attempt,
            status=ParticipantStatus(row.status),
            committable=Committable.from_json(row.committable),
            staged_location=row.staged_location,
            record_count=row.record_count,
            checksum=row.checksum,
            precommitted_at=row.precommitted_at,
            finished_at=row.finished_at,
        )

    def epoch(self, pipeline: str, number: int) -> Epoch:
        with self._tx() as s:
            return self._to_epoch(s, self._epoch_row(s, pipeline, number))

    def epochs(self, pipeline: str, *, last: int | None = None) -> list[Epoch]:
        """The pipeline's epochs in order (only the ``last`` ones if given)."""
        with self._tx() as s:
            stmt = select(EpochRow).where(EpochRow.pipeline == pipeline).order_by(EpochRow.epoch.desc())
            if last is not None:
                stmt = stmt.limit(last)
            rows = list(reversed(s.scalars(stmt).all()))
            if not rows:
                return []
            offsets = s.scalars(
                select(EpochOffsetRow)
                .where(EpochOffsetRow.pipeline == pipeline, EpochOffsetRow.epoch >= rows[0].epoch)
                .order_by(EpochOffsetRow.topic, EpochOffsetRow.partition)
            ).all()
        by_epoch: dict[int, list[EpochOffsetRow]] = {}
        for o in offsets:
            by_epoch.setdefault(o.epoch, []).append(o)
        return [self._build_epoch(row, by_epoch.get(row.epoch, [])) for row in rows]

    def open_epoch(self, pipeline: str) -> Epoch | None:
        """The pipeline's epoch that is not final yet, if any (there is at most one: invariant 1)."""
        with self._tx() as s:
            row = s.scalars(
                select(EpochRow).where(EpochRow.pipeline == pipeline, EpochRow.status.in_(OPEN_STATUSES))
            ).one_or_none()
            return None if row is None else self._to_epoch(s, row)

    def epoch_of_run(self, pipeline: str, run_id: str) -> Epoch | None:
        """The latest epoch the orchestrator run ``run_id`` planned (a re-planned run has several)."""
        with self._tx() as s:
            row = s.scalars(
                select(EpochRow)
                .where(EpochRow.pipeline == pipeline, EpochRow.run_id == run_id)
                .order_by(EpochRow.epoch.desc())
                .limit(1)
            ).one_or_none()
            return None if row is None else self._to_epoch(s, row)

    def find_by_interval(self, pipeline: str, start: datetime, end: datetime) -> list[Epoch]:
        """Epochs planned for exactly this data interval, e.g. to make a re-run of a committed one a no-op."""
        with self._tx() as s:
            rows = s.scalars(
                select(EpochRow)
                .where(
                    EpochRow.pipeline == pipeline,
                    EpochRow.data_interval_start == start,
                    EpochRow.data_interval_end == end,
                )
                .order_by(EpochRow.epoch)
            ).all()
            return [self._to_epoch(s, row) for row in rows]

    def pipelines(self) -> list[str]:
        with self._tx() as s:
            return list(s.scalars(select(PipelineRow.name).order_by(PipelineRow.name)).all())

    def reader_schema(self, pipeline: str) -> str | None:
        """The reader schema's text as the pipeline's last planned epoch read (None before any)."""
        with self._tx() as s:
            row = s.get(PipelineRow, pipeline)
            return None if row is None else row.reader_schema

    def participants(self, pipeline: str, number: int) -> list[Participant]:
        with self._tx() as s:
            rows = s.scalars(
                select(ParticipantRow)
                .where(ParticipantRow.pipeline == pipeline, ParticipantRow.epoch == number)
                .order_by(ParticipantRow.sink, ParticipantRow.task)
            ).all()
            return [self._to_participant(r) for r in rows]

    def sinks(self, pipeline: str) -> list[str]:
        """Every sink any epoch of the pipeline expected, e.g. to ask all of them for orphans."""
        with self._tx() as s:
            lists = s.scalars(
                select(EpochRow.expected_participants).where(EpochRow.pipeline == pipeline).distinct()
            ).all()
            registered = s.scalars(
                select(ParticipantRow.sink).where(ParticipantRow.pipeline == pipeline).distinct()
            ).all()
        names = set(registered)
        for text in lists:
            names.update(str(sink) for sink, _ in json.loads(text))
        return sorted(names)

    @staticmethod
    def _committed_offsets(s: Session, pipeline: str) -> dict[tuple[str, int], int]:
        rows = s.execute(
            select(EpochOffsetRow.topic, EpochOffsetRow.partition, func.max(EpochOffsetRow.until_offset))
            .join(
                EpochRow,
                (EpochRow.pipeline == EpochOffsetRow.pipeline) & (EpochRow.epoch == EpochOffsetRow.epoch),
            )
            .where(EpochOffsetRow.pipeline == pipeline, EpochRow.status == EpochStatus.COMMITTED.value)
            .group_by(EpochOffsetRow.topic, EpochOffsetRow.partition)
        ).all()
        return {(str(topic), int(partition)): int(until) for topic, partition, until in rows}

    def committed_offsets(self, pipeline: str) -> dict[tuple[str, int], int]:
        """Per (topic, partition), where the last COMMITTED epoch ended: where the next epoch must start."""
        with self._tx() as s:
            return self._committed_offsets(s, pipeline)

    # ------------------------------------------------------------------------------------------ plan

    def plan_epoch(
        self,
        pipeline: str,
        ranges: Sequence[OffsetRange],
        expected: Sequence[tuple[str, str]],
        *,
        run_id: str | None = None,
        data_interval: tuple[datetime, datetime] | None = None,
        replaces: int | None = None,
        owner: str | None = None,
        lease_s: float | None = None,
        reader_schema: str | None = None,
    ) -> Epoch:
        """Record epoch n+1's input ranges and participants before anything is processed.

        ``reader_schema``: the row type text the epoch reads with, kept as the pipeline's in the same
        transaction (`reader_schema`), so that the next plan compares with what the last epoch read.

        ``owner`` names who runs the epoch and ``lease_s`` how long it counts as alive without a renewal
        (`renew_lease`); recovery rolls back an undecided epoch only once its owner is gone.

        Refused while another epoch is not final (invariant 1) and for a range that does not start where
        the last committed epoch of its partition ended (invariant 2). Each plan gets a fresh attempt token
        that pre-commits must present.

        ``replaces`` plans instead a re-run of a COMMITTED epoch of the same data interval, over exactly
        its ranges, whose output will replace that epoch's: positions, being the furthest committed ends,
        do not move back.
        """
        if not pipeline or not isinstance(pipeline, str):
            raise InvalidPlan(f"pipeline name {pipeline!r}: expected a non-empty string")
        seen: set[tuple[str, int]] = set()
        for r in ranges:
            if (r.topic, r.partition) in seen:
                raise InvalidPlan(f"pipeline {pipeline!r}: partition {r.topic}[{r.partition}] planned twice")
            seen.add((r.topic, r.partition))
        pairs = sorted({(str(sink), str(task)) for sink, task in expected})
        if len(pairs) != len(expected):
            raise InvalidPlan(f"pipeline {pipeline!r}: a (sink, task) participant is listed twice")
        if any(not sink or not task for sink, task in pairs):
            raise InvalidPlan(f"pipeline {pipeline!r}: participants need non-empty sink and task names")
        if data_interval is not None:
            start, end = data_interval
            if start.tzinfo is None or end.tzinfo is None or end < start:
                raise InvalidPlan(
                    f"pipeline {pipeline!r}: data interval {start} .. {end} must be timezone-aware and "
                    "end no earlier than it starts"
                )
        for attempt in range(3):
            try:
                lease = (pairs, owner, lease_s)
                return self._plan_once(
                    pipeline, ranges, lease, run_id, data_interval, replaces, reader_schema
                )
            except IntegrityError as exc:
                # A concurrent planner inserted the pipeline or the same epoch first; look again.
                if attempt == 2:
                    raise EpochInFlight(
                        f"pipeline {pipeline!r}: another process is planning an epoch at the same time"
                    ) from exc
        raise AssertionError("unreachable")

    def _plan_once(
        self,
        pipeline: str,
        ranges: Sequence[OffsetRange],
        lease: tuple[list[tuple[str, str]], str | None, float | None],
        run_id: str | None,
        data_interval: tuple[datetime, datetime] | None,
        replaces: int | None = None,
        reader_schema: str | None = None,
    ) -> Epoch:
        pairs, owner, lease_s = lease
        now = utcnow()
        with self._tx() as s:
            if s.get(PipelineRow, pipeline, with_for_update=True) is None:
                s.execute(
                    insert(PipelineRow).values(name=pipeline, created_at=now)
                )  # columns of any revision
                s.flush()
            if reader_schema is not None:
                s.execute(
                    update(PipelineRow)
                    .where(PipelineRow.name == pipeline)
                    .values(reader_schema=reader_schema)
                )
            busy = s.scalars(
                select(EpochRow).where(EpochRow.pipeline == pipeline, EpochRow.status.in_(OPEN_STATUSES))
            ).first()
            if busy is not None:
                owned = f", owned by {busy.owner}" if busy.owner else ""
                raise EpochInFlight(
                    f"pipeline {pipeline!r}: epoch {busy.epoch} is still {busy.status}{owned}; it must be "
                    f"committed or aborted (e.g. `onceflow recover {pipeline}`) before another epoch is "
                    "planned"
                )
            if replaces is not None:
                self._check_replacement(s, pipeline, replaces, ranges, data_interval)
            committed = {} if replaces is not None else self._committed_offsets(s, pipeline)
            for r in ranges:
                position = committed.get((r.topic, r.partition))
                if position is not None and r.from_offset != position:
                    raise OffsetGap(
                        f"pipeline {pipeline!r}: range {r} must start at offset {position}, where the last "
                        "committed epoch of that partition ended"
                    )
            last = s.scalar(select(func.max(EpochRow.epoch)).where(EpochRow.pipeline == pipeline))
            row = EpochRow(
                pipeline=pipeline,
                epoch=(last or 0) + 1,
                status=EpochStatus.PLANNED.value,
                run_id=run_id,
                attempt_token=secrets.token_hex(16),
                data_interval_start=None if data_interval is None else data_interval[0],
                data_interval_end=None if data_interval is None else data_interval[1],
                expected_participants=json.dumps([list(p) for p in pairs]),
                planned_at=now,
                owner=owner,
                lease_expires_at=None if lease_s is None else now + timedelta(seconds=lease_s),
            )
            s.add(row)
            s.flush()
            s.add_all(
                EpochOffsetRow(
                    pipeline=pipeline,
                    epoch=row.epoch,
                    topic=r.topic,
                    partition=r.partition,
                    from_offset=r.from_offset,
                    until_offset=r.until_offset,
                )
                for r in ranges
            )
            s.flush()
            return self._to_epoch(s, row)

    def _check_replacement(
        self,
        s: Session,
        pipeline: str,
        replaces: int,
        ranges: Sequence[OffsetRange],
        data_interval: tuple[datetime, datetime] | None,
    ) -> None:
        old = self._to_epoch(s, self._epoch_row(s, pipeline, replaces))
        if old.status is not EpochStatus.COMMITTED:
            raise InvalidPlan(f"{old} is {old.status}: only a committed epoch's output can be replaced")
        interval = (old.data_interval_start, old.data_interval_end)
        if data_interval is None or interval != data_interval:
            raise InvalidPlan(f"{old} covers data interval {interval}, not {data_interval}")
        if sorted(old.ranges) != sorted(ranges):
            raise InvalidPlan(f"a replacement of {old} must read exactly its ranges {list(old.ranges)}")

    def renew_lease(self, pipeline: str, number: int, lease_s: float) -> bool:
        """Extend the lease of an epoch in flight; False once it is final (nothing left to keep alive)."""
        with self._tx() as s:
            result = s.execute(
                update(EpochRow)
                .where(
                    EpochRow.pipeline == pipeline,
                    EpochRow.epoch == number,
                    EpochRow.status.in_([status.value for status in OPEN_STATUSES]),
                )
                .values(lease_expires_at=utcnow() + timedelta(seconds=lease_s))
                .execution_options(synchronize_session=False)
            )
            return bool(result.rowcount == 1)  # type: ignore[attr-defined]

    # ------------------------------------------------------------------------------------ pre-commit

    def _check_fence(self, row: EpochRow, token: str, what: str, *, committed_ok: bool = False) -> None:
        if row.status != EpochStatus.PLANNED and not (committed_ok and row.status == EpochStatus.COMMITTED):
            raise EpochNotPlanned(
                f"{where(row.pipeline, row.epoch)} is {row.status}, not PLANNED: {what} refused "
                "(the caller must roll back its own staging)"
            )
        if token != row.attempt_token:
            raise StaleAttemptToken(
                f"{where(row.pipeline, row.epoch)}: {what} refused, its attempt token is not the current "
                "one (a zombie of a superseded attempt; the caller must roll back its own staging)"
            )

    def precommit_slice(
        self,
        pipeline: str,
        number: int,
        attempt_token: str,
        committables: Sequence[Committable],
        dead_letters: Sequence[DeadLetter] = (),
        *,
        after_commit: bool = False,
    ) -> Registration:
        """Record a slice's pre-commits and dead letters in one transaction (Flink's preCommit, decided
        at the driver as Spark's OutputCommitCoordinator does).

        Accepted only while the epoch is PLANNED, the token is current and every (sink, task) is expected
        (invariant 3); otherwise nothing is recorded and the caller rolls back every committable. Per
        task the first registered attempt wins: the same attempt again is a no-op (also once the epoch
        is decided), another attempt is returned in ``lost`` for the caller to roll back. Dead letters
        already recorded for a record are skipped. ``after_commit`` also accepts dead letters of a
        COMMITTED epoch (an at-most-once epoch commits before its records are read).
        """
        what = f"pre-commit of {len(committables)} committable(s) and {len(dead_letters)} dead letters"
        for retry in range(2):
            try:
                with self._tx() as s:
                    row = self._epoch_row(s, pipeline, number, lock="share")
                    existing = {(p.sink, p.task): p for p in self._participant_rows(s, pipeline, number)}
                    repeats = all(
                        (c.sink, c.task) in existing and existing[(c.sink, c.task)].attempt == c.attempt
                        for c in committables
                    )
                    if not (committables and repeats and row.status in _DECIDED_FOR_COMMIT):
                        # (A winner repeating itself after the decision is accepted: refusing would make
                        # it roll back the very output the epoch is committing.)
                        self._check_fence(row, attempt_token, what, committed_ok=after_commit)
                    expected = {(str(a), str(b)) for a, b in json.loads(row.expected_participants)}
                    accepted: list[Participant] = []
                    lost: list[Committable] = []
                    for c in committables:
                        if (c.pipeline, c.epoch) != (pipeline, number) or (c.sink, c.task) not in expected:
                            raise UnexpectedParticipant(
                                f"{where(pipeline, number)}: {what} refused, (sink, task) "
                                f"({c.sink!r}, {c.task!r}) of epoch {c.epoch} is not an expected participant"
                            )
                        winner = existing.get((c.sink, c.task))
                        if winner is not None:
                            if winner.attempt == c.attempt:
                                accepted.append(self._to_participant(winner))
                            else:
                                lost.append(c)
                            continue
                        new = ParticipantRow(
                            pipeline=c.pipeline,
                            epoch=c.epoch,
                            sink=c.sink,
                            task=c.task,
                            slice=c.slice,
                            attempt=c.attempt,
                            attempt_token=attempt_token,
                            committable=c.to_json(),
                            staged_location=staged_location(c),
                            record_count=c.record_count,
                            checksum=c.checksum,
                            status=ParticipantStatus.PRECOMMITTED.value,
                            precommitted_at=utcnow(),
                        )
                        s.add(new)
                        existing[(c.sink, c.task)] = new
                        accepted.append(self._to_participant(new))
                    added = dead_letter_pages.add(s, pipeline, number, dead_letters)
                    s.flush()
                    return Registration(tuple(accepted), tuple(lost), added)
            except IntegrityError:
                # Another slice driver registered the same task concurrently: look again to see who won.
                if retry:
                    raise
        raise AssertionError("unreachable")

    # ----------------------------------------------------------------------------------- transitions

    @staticmethod
    def _cas(
        s: Session, pipeline: str, number: int, old: EpochStatus, new: EpochStatus, **values: Any
    ) -> bool:
        result = s.execute(
            update(EpochRow)
            .where(EpochRow.pipeline == pipeline, EpochRow.epoch == number, EpochRow.status == old.value)
            .values(status=new.value, **values)
            .execution_options(synchronize_session=False)
        )
        return bool(result.rowcount == 1)  # type: ignore[attr-defined]

    def _transition(
        self, s: Session, row: EpochRow, old: EpochStatus, new: EpochStatus, **values: Any
    ) -> None:
        if not self._cas(s, row.pipeline, row.epoch, old, new, **values):
            raise IllegalTransition(
                f"{where(row.pipeline, row.epoch)} changed concurrently: it is no longer {old}, "
                f"so it cannot become {new}"
            )
        row.status = new.value
        for key, value in values.items():
            setattr(row, key, value)

    def _participant_rows(self, s: Session, pipeline: str, number: int) -> Sequence[ParticipantRow]:
        return s.scalars(
            select(ParticipantRow)
            .where(ParticipantRow.pipeline == pipeline, ParticipantRow.epoch == number)
            .order_by(ParticipantRow.sink, ParticipantRow.task)
        ).all()

    @staticmethod
    def _reached(row: EpochRow, outcome: _Outcome, doing: str) -> bool:
        """True once the epoch has reached the outcome's final status (a repeat is then a no-op); refused
        unless it is on its way there."""
        if row.status == outcome.final:
            return True
        if row.status != outcome.decided:
            raise IllegalTransition(f"cannot {doing}: the epoch is {row.status}, not {outcome.decided}")
        return False

    def _decide(
        self,
        pipeline: str,
        number: int,
        outcome: _Outcome,
        refusal: Callable[[Epoch], str | None],
        values: Callable[[Session, EpochRow], dict[str, Any]],
    ) -> Epoch:
        """PLANNED -> the outcome's decided status, idempotent once decided either way; refused when
        ``refusal`` (a rule of `onceflow.ledger.refusals`) names a reason. ``values`` checks what else the
        decision needs and returns what it records."""
        with self._tx() as s:
            row = self._epoch_row(s, pipeline, number, lock="update")
            if row.status in (outcome.decided, outcome.final):
                return self._to_epoch(s, row)
            refused = refusal(self._to_epoch(s, row))
            if refused is not None:
                raise Refused(refused)
            self._transition(s, row, EpochStatus.PLANNED, outcome.decided, **values(s, row))
            return self._to_epoch(s, row)

    def record_commit_decision(self, pipeline: str, number: int) -> Epoch:
        """Write the durable decision to commit: PLANNED -> COMMITTING (idempotent once decided).

        Only when every expected participant is PRECOMMITTED (invariant 4); refused once an abort began
        (invariant 6).
        """
        return self._decide(pipeline, number, _COMMIT, commit_refusal, self._every_participant_reported)

    def _every_participant_reported(self, s: Session, row: EpochRow) -> dict[str, Any]:
        reported = {(p.sink, p.task) for p in self._participant_rows(s, row.pipeline, row.epoch)}
        expected = [(str(a), str(b)) for a, b in json.loads(row.expected_participants)]
        missing = [pair for pair in expected if pair not in reported]
        if missing:
            names = ", ".join(f"{sink}/{task}" for sink, task in missing[:10])
            more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
            raise ParticipantsMissing(
                f"cannot commit {where(row.pipeline, row.epoch)}: {len(missing)} of {len(expected)} "
                f"expected participants have not pre-committed ({names}{more})"
            )
        return {"decided_at": utcnow()}

    def record_abort_decision(self, pipeline: str, number: int, reason: str) -> Epoch:
        """PLANNED -> ABORTING; idempotent once aborting; refused once decided (invariant 5)."""
        return self._decide(pipeline, number, _ABORT, abort_refusal, lambda s, row: {"abort_reason": reason})

    def _mark(self, pipeline: str, number: int, sink: str, outcome: _Outcome) -> int:
        """Set the sink's PRECOMMITTED participants to the outcome, once its committer has carried it out."""
        with self._tx() as s:
            row = self._epoch_row(s, pipeline, number, lock="share")
            to = outcome.participants
            if self._reached(row, outcome, f"mark sink {sink!r} of {where(pipeline, number)} {to}"):
                return 0
            result = s.execute(
                update(ParticipantRow)
                .where(
                    ParticipantRow.pipeline == pipeline,
                    ParticipantRow.epoch == number,
                    ParticipantRow.sink == sink,
                    ParticipantRow.status == ParticipantStatus.PRECOMMITTED.value,
                )
                .values(status=to.value, finished_at=utcnow())
                .execution_options(synchronize_session=False)
            )
            return int(result.rowcount)  # type: ignore[attr-defined]

    def mark_committed(self, pipeline: str, number: int, sink: str) -> int:
        """Record that the sink's committer committed its participants of a COMMITTING epoch."""
        return self._mark(pipeline, number, sink, _COMMIT)

    def mark_aborted(self, pipeline: str, number: int, sink: str) -> int:
        """Record that the sink's committer rolled back its participants of an ABORTING epoch."""
        return self._mark(pipeline, number, sink, _ABORT)

    def _finish(self, pipeline: str, number: int, outcome: _Outcome, pending_message: str) -> Epoch:
        """The last compare-and-set of either outcome, once every participant has reached it."""
        doing = f"finish {outcome.doing} {where(pipeline, number)}"
        with self._tx() as s:
            row = self._epoch_row(s, pipeline, number, lock="update")
            if self._reached(row, outcome, doing):
                return self._to_epoch(s, row)
            pending = [
                f"{p.sink}/{p.task}"
                for p in self._participant_rows(s, pipeline, number)
                if p.status != outcome.participants
            ]
            if pending:
                raise IllegalTransition(f"cannot {doing}: " + pending_message.format(", ".join(pending)))
            self._transition(s, row, outcome.decided, outcome.final, finished_at=utcnow())
            return self._to_epoch(s, row)

    def complete_commit(self, pipeline: str, number: int) -> Epoch:
        """COMMITTING -> COMMITTED once every participant is COMMITTED; idempotent."""
        return self._finish(
            pipeline,
            number,
            _COMMIT,
            "participants not committed yet ({}); commit them first "
            f"(`onceflow commit {pipeline} {number}`)",
        )

    def complete_abort(self, pipeline: str, number: int) -> Epoch:
        """ABORTING -> ABORTED once every participant is ABORTED; idempotent."""
        return self._finish(pipeline, number, _ABORT, "participants not rolled back yet ({})")

    # ---------------------------------------------------------------------------------- dead letters

    def dead_letters(
        self,
        pipeline: str,
        *,
        epoch: int | None = None,
        include_uncommitted: bool = False,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[StoredDeadLetter]:
        """Whole dead letters, payloads included, in epoch and position order (at most ``limit`` from
        ``offset`` on): for the few a page shows; `dead_letter_count` counts them."""
        with self._tx() as s:
            return dead_letter_pages.stored(
                s,
                pipeline,
                epoch=epoch,
                include_uncommitted=include_uncommitted,
                limit=limit,
                offset=offset,
            )

    def dead_letter_count(
        self, pipeline: str, *, epoch: int | None = None, include_uncommitted: bool = False
    ) -> int:
        """How many dead letters `dead_letters` would return, counted in SQL without their payloads."""
        with self._tx() as s:
            return dead_letter_pages.count(s, pipeline, epoch=epoch, include_uncommitted=include_uncommitted)

    def dead_letters_with(self, pipeline: str, number: int, letters: Sequence[DeadLetter]) -> int:
        """How many dead letters epoch ``number`` would hold with ``letters`` added (those kept already
        counted once): what `max_dead_letters_per_epoch` bounds, checked before the letters are kept."""
        with self._tx() as s:
            return dead_letter_pages.total_with(s, pipeline, number, letters)

    def dead_letter_page(
        self,
        pipeline: str,
        *,
        epoch: int | None = None,
        code: str | None = None,
        text: str | None = None,
        limit: int = 200,
        offset: int = 0,
        oldest_first: bool = False,
    ) -> dead_letter_pages.DeadLetterPage:
        """One page of the committed dead letters, filtered and counted in the database without their
        payloads (see `onceflow.ledger.dead_letter_pages`): what a list of them needs, however many."""
        dialect = self.engine.dialect.name
        with self._tx() as s:
            return dead_letter_pages.page(
                s,
                dialect,
                pipeline,
                epoch=epoch,
                code=code,
                text=text,
                limit=limit,
                offset=offset,
                oldest_first=oldest_first,
            )

    # ------------------------------------------------------------------------------------- retention

    def retain(
        self, pipeline: str, policy: RetentionPolicy, *, now: datetime | None = None
    ) -> RetentionResult:
        """Delete the pipeline's history that no step can still need (see `onceflow.ledger.retention`),
        in short transactions of bounded batches."""
        return retention.retain(self._tx, pipeline, policy, now=now)

    def row_counts(self, pipeline: str | None = None) -> dict[str, int]:
        """Rows per ledger table (of one pipeline if given): what retention keeps bounded."""
        with self._tx() as s:
            return retention.row_counts(s, pipeline)


__all__ = ["Ledger", "LedgerError", "Registration", "staged_location"]

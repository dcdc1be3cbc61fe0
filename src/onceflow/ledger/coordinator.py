"""The coordinator's half of two-phase commit: commit, abort and recover an epoch through its sinks.

These run in the Airflow ``commit`` / ``abort`` / ``recover`` tasks and in the CLI. Each step is idempotent
and recorded in the ledger before the next, so running any of them again after a crash at any point picks
up where the last run stopped (invariant 8: recovery never needs a human).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from onceflow.faults import crash_point
from onceflow.ledger.errors import MissingCommitter, SinkCallFailed
from onceflow.ledger.models import EpochStatus, ParticipantStatus
from onceflow.ledger.records import Epoch, Participant
from onceflow.sinks.base import Committable, SinkCommitter

if TYPE_CHECKING:
    from onceflow.ledger.ledger import Ledger

OrphanAction = Literal["abort", "commit", "keep"]


@dataclass(frozen=True)
class RecoveryReport:
    """What `recover` did, for the task log and ``onceflow recover --json``."""

    pipeline: str
    epoch: int | None = None
    outcome: Literal["nothing in flight", "committed", "aborted"] = "nothing in flight"
    participants_committed: int = 0
    participants_aborted: int = 0
    orphans_aborted: tuple[Committable, ...] = field(default=())
    orphans_recommitted: tuple[Committable, ...] = field(default=())
    orphans_kept: tuple[Committable, ...] = field(default=())

    def summary(self) -> str:
        head = (
            f"pipeline {self.pipeline!r}: nothing in flight"
            if self.epoch is None
            else f"pipeline {self.pipeline!r}: epoch {self.epoch} {self.outcome} "
            f"({self.participants_committed} participants committed, "
            f"{self.participants_aborted} aborted)"
        )
        return (
            f"{head}; orphans: {len(self.orphans_aborted)} rolled back, "
            f"{len(self.orphans_recommitted)} re-committed, {len(self.orphans_kept)} kept (epoch in flight)"
        )

    def to_dict(self) -> dict[str, Any]:
        def ids(cs: Sequence[Committable]) -> list[dict[str, Any]]:
            return [{"epoch": c.epoch, "sink": c.sink, "task": c.task, "attempt": c.attempt} for c in cs]

        return {
            "pipeline": self.pipeline,
            "epoch": self.epoch,
            "outcome": self.outcome,
            "participants_committed": self.participants_committed,
            "participants_aborted": self.participants_aborted,
            "orphans_aborted": ids(self.orphans_aborted),
            "orphans_recommitted": ids(self.orphans_recommitted),
            "orphans_kept": ids(self.orphans_kept),
        }


def _require(committers: Mapping[str, SinkCommitter], sinks: Sequence[str], epoch: Epoch) -> None:
    missing = [sink for sink in sinks if sink not in committers]
    if missing:
        raise MissingCommitter(f"{epoch}: no committer for sink(s) {', '.join(missing)}; nothing was changed")


def _by_sink(participants: Sequence[Participant], status: ParticipantStatus) -> dict[str, list[Committable]]:
    grouped: dict[str, list[Committable]] = {}
    for p in participants:
        if p.status is status:
            grouped.setdefault(p.sink, []).append(p.committable)
    return grouped


def _call(epoch: Epoch, sink: str, action: str, call: Any, committables: list[Committable]) -> None:
    try:
        call(committables)
    except Exception as exc:
        raise SinkCallFailed(
            f"{epoch}: {action} of {len(committables)} committable(s) of sink {sink!r} failed ({exc!r}); "
            f"the epoch stays {epoch.status} and the {action} is retried by the next commit, abort or "
            "recover"
        ) from exc


def commit_epoch(
    ledger: Ledger, pipeline: str, number: int, committers: Mapping[str, SinkCommitter]
) -> Epoch:
    """Commit epoch ``number`` (Flink's notifyCheckpointComplete); safe to repeat after a crash anywhere.

    1. Check that every sink of the epoch has a committer, before anything durable happens.
    2. Decide: PLANNED -> COMMITTING, written only when every expected participant is PRECOMMITTED
       (invariant 4); a no-op once decided; refused once an abort began (invariant 6).
    3. For each sink: commit its still-PRECOMMITTED committables through its committer (idempotent, so a
       retry after a crash between commit and mark is harmless), then mark them COMMITTED.
    4. Promote the epoch's staged state and finish: COMMITTING -> COMMITTED, in one transaction, which is
       what moves the source position and the state forward (invariant 7).
    """
    # 1.
    epoch = ledger.epoch(pipeline, number)
    _require(committers, epoch.sinks, epoch)
    # 2.
    crash_point("before_decision")
    epoch = ledger.decide(pipeline, number)
    if epoch.status is EpochStatus.COMMITTED:
        return epoch
    crash_point("after_decision")
    # 3.
    _commit_participants(ledger, epoch, committers)
    crash_point("before_finish")
    # 4.
    return ledger.finish(pipeline, number)


def _commit_participants(ledger: Ledger, epoch: Epoch, committers: Mapping[str, SinkCommitter]) -> int:
    pending = _by_sink(ledger.participants(epoch.pipeline, epoch.number), ParticipantStatus.PRECOMMITTED)
    done = 0
    for i, (sink, committables) in enumerate(sorted(pending.items())):
        if i:
            crash_point("between_commits")
        _call(epoch, sink, "commit", committers[sink].commit, committables)
        crash_point("participant_committed")
        done += ledger.mark_committed(epoch.pipeline, epoch.number, sink)
    return done


def abort_epoch(
    ledger: Ledger, pipeline: str, number: int, committers: Mapping[str, SinkCommitter], reason: str
) -> Epoch:
    """Abort an undecided epoch (Flink's abort); its range is replayed by the next epoch.

    1. Check that every sink with a registered participant has a committer.
    2. Begin: PLANNED -> ABORTING; a no-op once aborting; refused once COMMITTING (invariant 5).
    3. For each sink: roll back every registered participant's staging (idempotent), mark them ABORTED.
    4. Finish: ABORTING -> ABORTED, discarding the epoch's staged state in the same transaction.
    """
    # 1.
    epoch = ledger.epoch(pipeline, number)
    _require(committers, sorted({p.sink for p in ledger.participants(pipeline, number)}), epoch)
    # 2.
    epoch = ledger.begin_abort(pipeline, number, reason)
    if epoch.status is EpochStatus.ABORTED:
        return epoch
    crash_point("during_abort")
    # 3.
    _abort_participants(ledger, epoch, committers)
    # 4.
    return ledger.finish_abort(pipeline, number)


def _abort_participants(ledger: Ledger, epoch: Epoch, committers: Mapping[str, SinkCommitter]) -> int:
    participants = ledger.participants(epoch.pipeline, epoch.number)
    _require(committers, sorted({p.sink for p in participants}), epoch)
    done = 0
    for sink, committables in sorted(_by_sink(participants, ParticipantStatus.PRECOMMITTED).items()):
        _call(epoch, sink, "abort", committers[sink].abort, committables)
        done += ledger.mark_aborted(epoch.pipeline, epoch.number, sink)
    return done


def classify_orphan(orphan: Committable, epoch: Epoch | None, winner: Participant | None) -> OrphanAction:
    """What the sweeper does with staged output a sink reports (invariant 9).

    ``winner`` is the participant the ledger registered for the orphan's (sink, task), if any. Staging of
    a PLANNED epoch that is expected and not beaten by another attempt is kept: its task may be about to
    pre-commit. A winner of a COMMITTED epoch is committed again (a no-op if it was), never rolled back.
    """
    if epoch is None or epoch.status in (EpochStatus.ABORTING, EpochStatus.ABORTED):
        return "abort"
    owned = winner is not None and winner.attempt == orphan.attempt
    if epoch.status is EpochStatus.PLANNED:
        if (orphan.sink, orphan.task) not in epoch.expected:
            return "abort"
        return "keep" if owned or winner is None else "abort"
    if not owned:
        return "abort"  # a losing or unregistered attempt can never join a decided epoch
    return "commit" if epoch.status is EpochStatus.COMMITTED else "keep"


def recover(ledger: Ledger, pipeline: str, committers: Mapping[str, SinkCommitter]) -> RecoveryReport:
    """Bring a pipeline back to a clean state after a crash anywhere (Flink's initializeState).

    1. Find the epoch in flight, if any (at most one: invariant 1).
    2. COMMITTING: the decision is durable, so commit every participant through its sink's committer,
       mark them committed and finish (invariant 5).
    3. PLANNED or ABORTING: nothing was decided, so roll back every registered participant, mark them
       aborted and finish the abort; the next epoch replays the range (invariants 2 and 6).
    4. Sweep: list every committer's orphans first, then read the ledger (so an epoch planned meanwhile is
       seen as in flight), and roll back each orphan the ledger does not own: unknown epochs, aborted
       epochs, unexpected tasks and losing attempts (invariant 9); re-commit a committed epoch's winner.
    """
    report = RecoveryReport(pipeline=pipeline)
    # 1.
    epoch = ledger.open_epoch(pipeline)
    if epoch is not None and epoch.status is EpochStatus.COMMITTING:
        # 2.
        _require(committers, epoch.sinks, epoch)
        committed = _commit_participants(ledger, epoch, committers)
        crash_point("during_recover")
        ledger.finish(pipeline, epoch.number)
        report = RecoveryReport(pipeline, epoch.number, "committed", participants_committed=committed)
    elif epoch is not None:
        # 3.
        _require(committers, sorted({p.sink for p in ledger.participants(pipeline, epoch.number)}), epoch)
        ledger.begin_abort(pipeline, epoch.number, "recovery: the epoch was not decided before a crash")
        aborted = _abort_participants(ledger, epoch, committers)
        crash_point("during_recover")
        ledger.finish_abort(pipeline, epoch.number)
        report = RecoveryReport(pipeline, epoch.number, "aborted", participants_aborted=aborted)
    # 4.
    return _sweep(ledger, pipeline, committers, report)


def _sweep(
    ledger: Ledger, pipeline: str, committers: Mapping[str, SinkCommitter], report: RecoveryReport
) -> RecoveryReport:
    found: dict[tuple[int, str, str, str], tuple[Committable, SinkCommitter]] = {}
    for _, committer in sorted(committers.items()):
        for orphan in committer.orphans(pipeline):
            found.setdefault((orphan.epoch, orphan.sink, orphan.task, orphan.attempt), (orphan, committer))
    if not found:
        return report
    epochs = {e.number: e for e in ledger.epochs(pipeline)}
    winners: dict[int, dict[tuple[str, str], Participant]] = {}
    actions: dict[OrphanAction, list[tuple[Committable, SinkCommitter]]] = {
        "abort": [],
        "commit": [],
        "keep": [],
    }
    for orphan, committer in found.values():
        epoch = epochs.get(orphan.epoch)
        if epoch is not None and epoch.number not in winners:
            winners[epoch.number] = {(p.sink, p.task): p for p in ledger.participants(pipeline, epoch.number)}
        winner = None if epoch is None else winners[epoch.number].get((orphan.sink, orphan.task))
        action = classify_orphan(orphan, epoch, winner)
        # Re-commit with the committable the ledger holds: it is the full handle the writer reported.
        chosen = winner.committable if action == "commit" and winner is not None else orphan
        actions[action].append((chosen, committer))
    for orphan, committer in actions["abort"]:
        committer.abort([orphan])
    for orphan, committer in actions["commit"]:
        committer.commit([orphan])
    return replace(
        report,
        orphans_aborted=tuple(c for c, _ in actions["abort"]),
        orphans_recommitted=tuple(c for c, _ in actions["commit"]),
        orphans_kept=tuple(c for c, _ in actions["keep"]),
    )

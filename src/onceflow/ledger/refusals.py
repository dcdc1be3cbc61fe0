"""The two refusals the invariants demand, worded once for every door.

The coordinator asks them before it acts (so a refusal comes before any other complaint) and the ledger
again inside the transaction that would make the transition (so a concurrent action cannot slip past):
one rule, checked where each needs it, with the same words in the task log, the terminal and the
console.
"""

from __future__ import annotations

from onceflow.ledger.models import EpochStatus
from onceflow.ledger.records import Epoch, where


def commit_refusal(epoch: Epoch) -> str | None:
    """Why ``commit`` must not touch ``epoch`` (invariant 6), or None when committing is allowed."""
    if epoch.status not in (EpochStatus.ABORTING, EpochStatus.ABORTED):
        return None
    return (
        f"commit refused: cannot commit {where(epoch.pipeline, epoch.number)}: it is {epoch.status} "
        f"(abort reason: {epoch.abort_reason or 'none given'}); once an abort has begun, commit is "
        "refused and its range is replayed by the next epoch"
    )


def abort_refusal(epoch: Epoch) -> str | None:
    """Why ``abort`` must not touch ``epoch`` (invariant 5), or None when aborting is allowed."""
    if epoch.status not in (EpochStatus.COMMITTING, EpochStatus.COMMITTED):
        return None
    finish = (
        f" (finish it by clearing `commit` or `onceflow commit {epoch.pipeline} {epoch.number}`)"
        if epoch.status is EpochStatus.COMMITTING
        else ""
    )
    return (
        f"abort refused: cannot abort {where(epoch.pipeline, epoch.number)}: it is {epoch.status}; the "
        f"decision to commit is durable, so the only outcome is COMMITTED and nothing was rolled "
        f"back{finish}"
    )

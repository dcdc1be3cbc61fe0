"""The coordinator's decisions as pure functions: what to plan, whether a slice runs, what recovery
does, and what the sweeper does with each orphan.

No I/O here: the coordinator reads the ledger, asks these functions, then acts; so every branch of the
protocol's choices has a fast unit test, and every door (DAG task, CLI, runner, slice job) acts on the
same answer. The refusals of commit and abort live beside the ledger's transitions
(`onceflow.ledger.refusals`), which check them again under their compare-and-set.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from onceflow.committables import Committable
from onceflow.ledger.models import EpochStatus
from onceflow.ledger.records import Epoch, Participant

PlanAction = Literal["plan", "reuse", "already_committed", "replace", "wait"]
RecoverAction = Literal["nothing", "commit", "abort", "keep"]
OrphanAction = Literal["abort", "commit", "keep"]


@dataclass(frozen=True)
class PlanDecision:
    """What ``plan`` does for a run: plan a new epoch, reuse or replace one, do nothing, or wait."""

    action: PlanAction
    epoch: Epoch | None = None
    line: str = ""


def _interval(epoch: Epoch) -> str:
    start, end = epoch.data_interval_start, epoch.data_interval_end
    return f"{start.isoformat() if start else '?'} .. {end.isoformat() if end else '?'}"


def decide_plan(
    *,
    own: Epoch | None,
    interval_done: Epoch | None,
    in_flight: Epoch | None,
    replaces_intervals: bool,
) -> PlanDecision:
    """Decide what ``plan`` does, from what the ledger says about this run and its data interval.

    1. This run planned an epoch already: a committed one is replaced (``on_rerun="replace"``) or left
       alone (the run was re-run); an undecided or decided one is processed again (idempotent).
    2. The run's data interval already has a committed epoch: replaced, or nothing to do (each interval
       is processed exactly once).
    3. Another run's epoch is in flight (its owner is alive, or recover would have finished it): wait.
    4. Otherwise plan the next epoch.
    """
    # 1.
    if own is not None and own.status is EpochStatus.COMMITTED:
        if replaces_intervals and own.data_interval_start is not None:
            return PlanDecision("replace", own)
        return PlanDecision(
            "already_committed", own, f"{own} was committed by this run already: nothing to do"
        )
    if own is not None and own.status in (EpochStatus.PLANNED, EpochStatus.COMMITTING):
        return PlanDecision(
            "reuse", own, f"{own} was planned by this run already: processing it again (idempotent)"
        )
    # 2.
    if interval_done is not None:
        if replaces_intervals:
            return PlanDecision("replace", interval_done)
        return PlanDecision(
            "already_committed",
            interval_done,
            f"data interval {_interval(interval_done)} was already processed by {interval_done} "
            f"(run {interval_done.run_id}): nothing to do; each interval is processed exactly once",
        )
    # 3.
    if in_flight is not None:
        return PlanDecision("wait", in_flight, owned_line(in_flight))
    # 4.
    return PlanDecision("plan")


def owned_line(epoch: Epoch) -> str:
    """Who holds the epoch in flight, and until when, for a runner that has to wait for it."""
    owner = epoch.owner or "no recorded owner"
    until = (
        f", lease until {epoch.lease_expires_at.isoformat(timespec='seconds')}"
        if epoch.lease_expires_at
        else ""
    )
    return (
        f"{epoch} is in flight, owned by {owner}{until}; epochs of a pipeline run one at a time, so this "
        "runner waits for it (or run `onceflow recover --force` if that owner is gone for good)"
    )


def decide_recovery(
    epoch: Epoch | None, *, now: datetime, owner_alive: bool | None, force: bool
) -> tuple[RecoverAction, str]:
    """What ``recover`` does with the epoch in flight, and why (the reason an abort records).

    1. Nothing in flight: nothing to finish.
    2. Its owner is alive (the process runs, or its lease has not expired): keep it, unless forced;
       recovery never rolls back, nor races, live work.
    3. COMMITTING: the decision is durable, so the only outcome is to finish the commit (invariant 5).
    4. ABORTING: finish the abort.
    5. PLANNED and its owner gone (or forced): roll it back; the next epoch replays its range.
    """
    # 1.
    if epoch is None:
        return "nothing", ""
    owner = epoch.owner or "an unrecorded owner"
    expired = epoch.lease_expires_at is None or epoch.lease_expires_at <= now
    alive = (not expired) if owner_alive is None else (owner_alive and not expired)
    # 2.
    if alive and not force:
        return "keep", f"owned by {owner}, which is alive"
    # 3.
    if epoch.status is EpochStatus.COMMITTING:
        return "commit", "the decision to commit is durable"
    # 4.
    if epoch.status is EpochStatus.ABORTING:
        return "abort", epoch.abort_reason or "the abort had begun"
    # 5.
    if force and alive:
        return "abort", f"forced by the operator while {owner} still held it"
    if owner_alive is False:
        return "abort", f"its owner {owner} is no longer running"
    lease = epoch.lease_expires_at.isoformat(timespec="seconds") if epoch.lease_expires_at else "never set"
    return "abort", f"the lease of its owner {owner} expired ({lease}) without a renewal"


def slice_refusal(epoch: Epoch, *, at_most_once: bool, attempt_token: str | None = None) -> str | None:
    """Why a slice of ``epoch`` must not run, or None when it may (the slice gate).

    A slice runs only while its epoch is PLANNED (an at-most-once epoch is committed when planned and is
    processed all the same), and, for a slice job given the epoch's ``attempt_token``, only under that
    token: a cleared, retried or late job must not touch an epoch that has moved on or been re-planned.
    """
    if attempt_token is not None and epoch.attempt_token != attempt_token:
        return f"{epoch} is {epoch.status} with another attempt token than this job's; nothing was processed"
    if epoch.status is EpochStatus.PLANNED or (at_most_once and epoch.status is EpochStatus.COMMITTED):
        return None
    return f"{epoch} is {epoch.status}: the slice has nothing left to do"


def classify_orphan(orphan: Committable, epoch: Epoch | None, winner: Participant | None) -> OrphanAction:
    """What the sweeper does with staged output a sink reports (invariant 9).

    ``winner`` is the participant the ledger registered for the orphan's (sink, task), if any. Staging of
    a PLANNED epoch that is expected and not beaten by another attempt is kept: its slice's driver may be
    about to register it. A winner of a COMMITTED epoch is committed again (a no-op if it was), never
    rolled back.
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

"""The sweeper (invariant 9): staged or prepared output that the ledger does not own is rolled back.

Sinks list what they hold staged for a pipeline (`SinkCommitter.orphans`); the ledger says which epoch
and which attempt each belongs to; `decisions.classify_orphan` says what to do with it. Recovery sweeps
the whole pipeline; a slice's pre-commit sweeps its own tasks, so an attempt that staged and never
reported (a speculative copy Spark discarded) is rolled back at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from onceflow.committables import Committable
from onceflow.errors import one_line
from onceflow.ledger import Ledger, Participant, SinkCallFailed
from onceflow.protocol.decisions import OrphanAction, classify_orphan
from onceflow.protocol.step_results import RecoveryReport
from onceflow.sinks.base import SinkCommitter


def sweep_orphans(
    ledger: Ledger,
    pipeline: str,
    committers: Mapping[str, SinkCommitter],
    report: RecoveryReport | None = None,
    *,
    only: tuple[int, set[str]] | None = None,
) -> RecoveryReport:
    """Roll back every orphan the ledger does not own; re-commit a committed winner; ``report`` with the
    orphans added. ``only`` limits the sweep to one epoch's tasks.

    1. List every committer's orphans first, then read the ledger (so that an epoch planned meanwhile
       is seen as in flight and its staging is kept).
    2. Classify each (`decisions.classify_orphan`): unknown and aborted epochs, unexpected tasks and
       losing attempts are rolled back; staging a live epoch may still register is kept.
    """
    report = report or RecoveryReport(pipeline=pipeline)
    # 1.
    found: dict[tuple[int, str, str, str], tuple[Committable, SinkCommitter]] = {}
    for sink, committer in sorted(committers.items()):
        for orphan in _orphans(pipeline, sink, committer):
            if only is not None and (orphan.epoch != only[0] or orphan.task not in only[1]):
                continue
            found.setdefault((orphan.epoch, orphan.sink, orphan.task, orphan.attempt), (orphan, committer))
    if not found:
        return report
    if only is None:
        epochs = {e.number: e for e in ledger.epochs(pipeline)}
    else:
        epochs = {only[0]: ledger.epoch(pipeline, only[0])}
    winners: dict[int, dict[tuple[str, str], Participant]] = {}
    actions: dict[OrphanAction, list[tuple[Committable, SinkCommitter]]] = {
        "abort": [],
        "commit": [],
        "keep": [],
    }
    # 2.
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


def _orphans(pipeline: str, sink: str, committer: SinkCommitter) -> list[Committable]:
    try:
        return list(committer.orphans(pipeline))
    except Exception as exc:
        raise SinkCallFailed(
            f"pipeline {pipeline!r}: the sweep could not list the staged work of sink {sink!r} "
            f"({type(exc).__name__}: {one_line(exc)}); nothing was changed: check that the sink's "
            "service is reachable, then run again"
        ) from exc

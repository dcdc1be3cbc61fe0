"""Ledger retention as a protocol step: on demand (``onceflow retain``) and after every N-th commit.

The ledger does the deleting (`Ledger.retain`, in batches, never anything a step can still need); this
module chooses the policy from the settings and decides when a commit applies it, so the ledger stays
bounded without a scheduled job.
"""

from __future__ import annotations

from datetime import timedelta

from onceflow.config import Settings
from onceflow.errors import ConfigError, one_line
from onceflow.ledger import Ledger
from onceflow.ledger.retention import RetentionPolicy, RetentionResult
from onceflow.logs import Log


def retention_interval(retain_epochs: int) -> int:
    """How often a commit applies retention: every tenth of the kept epochs, so its cost (finding the
    epochs that hold a position reads every kept offset row) is paid once per that many epochs, and a
    pipeline keeps at most ``retain_epochs`` plus that many committed epochs."""
    return max(1, retain_epochs // 10)


def retention_policy(pipeline: str, keep_epochs: int, dead_letter_days: float) -> RetentionPolicy:
    try:
        return RetentionPolicy(keep_epochs=keep_epochs, dead_letter_age=timedelta(days=dead_letter_days))
    except ValueError as exc:
        raise ConfigError(f"retention of pipeline {pipeline!r}: {exc}") from exc


def retain(
    ledger: Ledger,
    pipeline: str,
    settings: Settings,
    log: Log,
    *,
    keep_epochs: int | None = None,
    dead_letter_days: float | None = None,
) -> RetentionResult:
    """Delete the pipeline's ledger history that no step can still need; rows deleted per kind.

    1. Take the policy from the arguments, else from the settings (``retain_epochs``,
       ``dead_letter_days``); with retention off (0 epochs) and no ``keep_epochs``, do nothing.
    2. Let the ledger delete in batches, one transaction each (`Ledger.retain`): old final epochs
       with their rows, except those holding a partition's position, the data interval in flight and
       young dead letters; old dead letters of finished epochs.
    3. Log one line per kind.
    """
    # 1.
    keep = settings.retain_epochs if keep_epochs is None else keep_epochs
    days = settings.dead_letter_days if dead_letter_days is None else dead_letter_days
    if keep == 0:
        log(f"pipeline {pipeline!r}: retention is off (ONCEFLOW_RETAIN_EPOCHS=0)")
        return RetentionResult(pipeline)
    # 2.
    result = ledger.retain(pipeline, retention_policy(pipeline, keep, days))
    # 3.
    for line in result.lines():
        log(line)
    return result


def retain_after_commit(ledger: Ledger, pipeline: str, number: int, settings: Settings, log: Log) -> None:
    """Step 7 of `commit`: every `retention_interval` epochs, retention as configured; a failure never
    fails a complete commit (a later one retains again)."""
    if settings.retain_epochs == 0:
        return
    every = retention_interval(settings.retain_epochs)
    if number % every:
        return
    try:
        policy = retention_policy(pipeline, settings.retain_epochs, settings.dead_letter_days)
        result = ledger.retain(pipeline, policy)
    except Exception as exc:
        log(
            f"pipeline {pipeline!r}: retention skipped ({one_line(exc)}); the commit of epoch "
            f"{number + every} tries again, or run `onceflow retain {pipeline}`"
        )
        return
    if result.total:
        counts = ", ".join(f"{rows} {kind}" for kind, rows in result.deleted.items() if rows)
        log(f"pipeline {pipeline!r}: retention deleted {counts}")

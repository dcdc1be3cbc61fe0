"""Which Delta table version holds which epoch of a pipeline's sink, read from the table's log.

The committer makes one Delta commit per epoch that staged rows, and writes ``onceflow.pipeline``,
``onceflow.sink`` and ``onceflow.epoch`` into that commit's ``commitInfo``; commits without them are
another writer's. So the log alone maps epochs to versions, and a reader travels to an epoch with any
Delta reader's time travel, e.g. delta-rs ``DeltaTable(path, version=v)`` or Spark's
``spark.read.format("delta").option("versionAsOf", v).load(path)``.

An epoch that staged no rows (it read nothing, or its transform kept nothing) makes no commit: the
table as of it is the table as of the last earlier epoch that wrote (`version_as_of_epoch`). The map
only knows what the log still holds: commits older than the table's log retention
(``delta.logRetentionDuration``, 30 days by default) are gone from it once a checkpoint is written, and
with them their epochs.

A table given by its path is opened with ``storage_options`` (delta-rs's), e.g. a bucket's
`S3Settings.delta_options`; an open `DeltaTable` is read as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deltalake import DeltaTable

PIPELINE_KEY = "onceflow.pipeline"
SINK_KEY = "onceflow.sink"
EPOCH_KEY = "onceflow.epoch"
PARTICIPANTS_KEY = "onceflow.participants"


@dataclass(frozen=True)
class EpochCommit:
    """One epoch's Delta commit: the table version it made and the commit's time (``commitInfo``'s
    ``timestamp``, epoch milliseconds). delta-spark's ``timestampAsOf`` times a commit by its log file's
    modification instead, which may be a few milliseconds later: to travel there by time, ask for a
    moment between this commit and the next."""

    epoch: int
    version: int
    timestamp_ms: int
    participants: int | None


Options = Mapping[str, str] | None


def epoch_commits(
    table: str | DeltaTable, pipeline: str, sink: str, storage_options: Options = None
) -> list[EpochCommit]:
    """The commits of (pipeline, sink) in the table's log, by epoch. Should an epoch appear twice (it
    cannot through the committer, whose ``txn`` action refuses a repeat), its first commit is kept:
    that is the version from which its rows are in the table."""
    found: dict[int, EpochCommit] = {}
    for info in _open(table, storage_options).history():
        if info.get(PIPELINE_KEY) != pipeline or info.get(SINK_KEY) != sink:
            continue
        epoch = _integer(info.get(EPOCH_KEY))
        version = _integer(info.get("version"))
        if epoch is None or version is None:
            continue
        known = found.get(epoch)
        if known is None or version < known.version:
            found[epoch] = EpochCommit(
                epoch=epoch,
                version=version,
                timestamp_ms=_integer(info.get("timestamp")) or 0,
                participants=_integer(info.get(PARTICIPANTS_KEY)),
            )
    return [found[e] for e in sorted(found)]


def epoch_versions(
    table: str | DeltaTable, pipeline: str, sink: str, storage_options: Options = None
) -> dict[int, int]:
    """Epoch → the table version its commit made, for every epoch of (pipeline, sink) that wrote rows."""
    return {c.epoch: c.version for c in epoch_commits(table, pipeline, sink, storage_options)}


def version_of_epoch(
    table: str | DeltaTable, pipeline: str, sink: str, epoch: int, storage_options: Options = None
) -> int:
    """The table version whose commit holds ``epoch`` of (pipeline, sink); LookupError when the log has
    no commit of that epoch (it wrote nothing, is not committed yet, or left the log)."""
    versions = epoch_versions(table, pipeline, sink, storage_options)
    if epoch not in versions:
        raise LookupError(
            f"no Delta commit of epoch {epoch} of {pipeline}:{sink} in the table's log ({_span(versions)})"
        )
    return versions[epoch]


def version_as_of_epoch(
    table: str | DeltaTable, pipeline: str, sink: str, epoch: int, storage_options: Options = None
) -> int | None:
    """The version of the last commit of (pipeline, sink) at or before ``epoch``: the table as the
    pipeline left it once ``epoch`` committed, epochs that staged nothing included. None when no earlier
    epoch is in the log. Whether ``epoch`` itself has committed yet is the ledger's to say, not the log's."""
    earlier = [c for c in epoch_commits(table, pipeline, sink, storage_options) if c.epoch <= epoch]
    return earlier[-1].version if earlier else None


def _open(table: str | DeltaTable, storage_options: Options) -> DeltaTable:
    if isinstance(table, str):
        from deltalake import DeltaTable

        return DeltaTable(table, storage_options=dict(storage_options) if storage_options else None)
    return table


def _integer(value: Any) -> int | None:
    """A commitInfo value as an int: delta-rs keeps a number as a number, other writers may keep text."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _span(versions: dict[int, int]) -> str:
    if not versions:
        return "it holds none of theirs"
    return f"it holds {len(versions)} of their epochs, {min(versions)} to {max(versions)}"

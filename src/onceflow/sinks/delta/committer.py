"""The Delta sink's committer: one Delta commit per epoch, recognised in the log when it is repeated.

The commit holds the add actions of every participant's staged files and a ``txn`` action
``(appId = "<pipeline>:<sink>", version = epoch)`` (Delta's idempotent-write mechanism, the one
Structured Streaming's Delta sink uses). Epochs of a pipeline commit in order, so the app's
transaction version says which epochs are in the table: a retried commit, or one recovered after a
crash between the Delta commit and the ledger, finds its epoch there and does nothing.

A commit that races another writer is retried by delta-rs's conflict checker, which lets appends
through (another app's append between stage and commit is kept, ours added once) and refuses what
conflicts; the committer then re-reads the table, stops if its epoch landed, and tries again, up to
``commit_retries`` times, before failing with one line.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

from onceflow.sinks.base import Committable
from onceflow.sinks.delta import layout
from onceflow.sinks.delta.config import DeltaConfig, as_config
from onceflow.sinks.errors import AlreadyCommitted, RetryLater, StagedOutputLost

log = logging.getLogger(__name__)


def app_id(pipeline: str, sink: str) -> str:
    """The ``txn`` app id of one pipeline's sink."""
    return f"{pipeline}:{sink}"


def committed_epoch(table: Any, pipeline: str, sink: str) -> int:
    """The last epoch of (pipeline, sink) in the table's log, or -1."""
    version = table.transaction_version(app_id(pipeline, sink))
    return -1 if version is None else int(version)


class DeltaCommitter:
    """Commits an epoch's staged files in one Delta commit, idempotently; aborts by deleting them."""

    def __init__(self, config: DeltaConfig | Mapping[str, Any]) -> None:
        self.config = as_config(config)
        self._store = self.config.store()

    def _load(self) -> Any | None:
        if not self.config.is_table():
            return None
        return self.config.open_table()

    # What an epoch's staged files hold, as errors name them.
    staged_what = "data files"

    def commit(self, committables: Sequence[Committable]) -> None:
        """Per epoch: 1. re-read the table; if the log has the epoch's txn, stop; 2. check every staged
        file is there; 3. one commit (`_write`, with the txn), conflicts back to 1; 4. `_forget`."""
        for epoch, group in _by_epoch(committables).items():
            for c in group:
                if c.handle.get("incomplete"):
                    raise StagedOutputLost(
                        f"{self.config.kind}: {c.sink} epoch {c.epoch} {c.task} never pre-committed"
                    )
            self._commit_epoch(epoch, group)
            self._forget(group)

    def _commit_epoch(self, epoch: int, group: list[Committable]) -> None:
        from deltalake.exceptions import CommitFailedError

        first = group[0]
        specs = [spec for c in group for spec in c.handle.get("files", [])]
        if not specs:
            return  # nothing staged: the next epoch's txn version covers this one
        last_error: Exception | None = None
        for attempt in range(1, self.config.commit_retries + 2):
            table = self._load()  # 1.
            if table is None:
                raise StagedOutputLost(
                    f"{self.config.where}: the table is gone, with epoch {epoch}'s {len(specs)} "
                    f"{self.staged_what}"
                )
            if committed_epoch(table, first.pipeline, first.sink) >= epoch:
                return
            missing = [s["path"] for s in specs if not self._store.exists(self._uri(s["path"]))]  # 2.
            if missing:
                raise StagedOutputLost(
                    f"{self.config.where}: epoch {epoch} is not in the table and {len(missing)} of its "
                    f"{self.staged_what} are gone (e.g. {missing[0]})"
                )
            try:
                self._write(table, epoch, group, specs)  # 3.
                return
            except CommitFailedError as exc:
                last_error = exc
                log.info("%s: epoch %s commit conflicted (%s); re-reading", self.config.where, epoch, exc)
                time.sleep(min(0.05 * (2 ** (attempt - 1)), 2.0) * (1 + random.random()))
        table = self._load()
        if table is not None and committed_epoch(table, first.pipeline, first.sink) >= epoch:
            return
        raise RetryLater(
            f"{self.config.where}: epoch {epoch} conflicts with another writer of the table after "
            f"{self.config.commit_retries + 1} tries ({_one_line(last_error)}); nothing of it is in the table"
        )

    def _write(self, table: Any, epoch: int, group: list[Committable], specs: list[dict[str, Any]]) -> None:
        """The epoch's one Delta commit: its staged files added as they are, with its txn."""
        partition_by = list(table.metadata().partition_columns)
        table.create_write_transaction(
            [layout.add_action(s) for s in specs],
            "append",
            table.schema(),
            partition_by=partition_by or None,
            commit_properties=self._commit_properties(epoch, group),
        )

    def _commit_properties(self, epoch: int, group: list[Committable]) -> Any:
        """The commit's ``txn`` action and the ``commitInfo`` that names its pipeline, sink and epoch."""
        from deltalake import CommitProperties, Transaction

        first = group[0]
        return CommitProperties(
            custom_metadata={
                "onceflow.pipeline": first.pipeline,
                "onceflow.sink": first.sink,
                "onceflow.epoch": epoch,
                "onceflow.participants": len(group),
            },
            max_commit_retries=self.config.commit_retries,
            app_transactions=[Transaction(app_id(first.pipeline, first.sink), epoch)],
        )

    def _forget(self, group: Sequence[Committable]) -> None:
        """After the commit: the markers go; the files are the table's now."""
        for c in group:
            self._store.delete_file(layout.marker_uri(self.config.path, c))

    def _uri(self, relative: str) -> str:
        return f"{self._store.uri(self._store.path(self.config.path)).rstrip('/')}/{relative}"

    def abort(self, committables: Sequence[Committable]) -> None:
        """Delete the attempts' files and markers; refuse when the log holds one of their files."""
        table = self._load()
        live: set[str] | None = None
        for c in committables:
            folder = layout.attempt_dir(self.config.path, c)
            if table is not None and committed_epoch(table, c.pipeline, c.sink) >= c.epoch:
                if live is None:  # as store paths: delta-rs names a bucket's files by s3:// URL
                    live = {self._store.path(u) for u in table.file_uris()}
                held = [u for u in self._store.files_under(folder) if self._store.path(u) in live]
                if held:
                    raise AlreadyCommitted(f"delta: {held[0]} is in the log of {self.config.path}")
            self._store.delete_dir(folder)
            self._store.delete_file(layout.marker_uri(self.config.path, c))

    def orphans(self, pipeline: str) -> list[Committable]:
        return layout.list_markers(self._store, self.config.path, pipeline, self.config.name)


def _one_line(error: Exception | None) -> str:
    return " ".join(str(error).split())


def _by_epoch(committables: Sequence[Committable]) -> dict[int, list[Committable]]:
    groups: dict[int, list[Committable]] = {}
    for c in sorted(committables, key=lambda c: (c.epoch, c.task)):
        groups.setdefault(c.epoch, []).append(c)
    return groups

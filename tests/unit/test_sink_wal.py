"""The write-ahead-log sink's commit streams a task's log into the table: its memory is one batch of
rows, not the whole log."""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

import psycopg
import pytest

from onceflow.sinks import wal
from onceflow.sinks.base import TaskContext

ROWS = 40_000
BATCH = 500


class FakeConnection:
    def __enter__(self) -> FakeConnection:
        return self

    def __exit__(self, *exc: object) -> None: ...


def test_commit_pushes_a_large_log_in_batches_without_holding_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = {
        "root": str(tmp_path),
        "dsn": "postgresql://u@127.0.0.1:1/x",
        "table": "t",
        "columns": {"id": "bigint", "name": "text", "amount": "double precision"},
        "create_table": False,
        "batch_size": BATCH,
    }
    writer = wal.WalWriter(config)
    writer.begin(TaskContext("p", 1, 0, "s0-t0", "a1", "out"))
    writer.write({"id": i, "name": f"customer-{i:08d}", "amount": i / 7} for i in range(ROWS))
    committable = writer.pre_commit()
    log_size = (wal.StagingArea(tmp_path).for_committable(committable) / wal.LOG).stat().st_size

    pushed: list[int] = []

    def insert_rows(conn: Any, statement: Any, rows: list[tuple[Any, ...]]) -> None:
        assert rows[0][0] == sum(pushed), "rows out of order"
        pushed.append(len(rows))

    def sha256_file(path: Path) -> str:
        digest = checksum(path)
        tracemalloc.reset_peak()  # the checksum reads fixed 1 MiB blocks: the push is measured from here
        return digest

    checksum = wal.sha256_file
    monkeypatch.setattr(psycopg, "connect", lambda *a, **k: FakeConnection())
    monkeypatch.setattr(wal, "insert_rows", insert_rows)
    monkeypatch.setattr(wal, "sha256_file", sha256_file)
    tracemalloc.start()
    try:
        wal.WalCommitter(config).commit([committable])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert pushed == [BATCH] * (ROWS // BATCH)
    assert peak < log_size / 4, f"the commit held {peak:,} bytes for a {log_size:,}-byte log"

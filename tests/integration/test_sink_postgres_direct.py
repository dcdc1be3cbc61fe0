"""plain, postgres_upsert and wal sinks on the real PostgreSQL: what each does on a replayed epoch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from onceflow.sinks import build_committer, build_writer
from onceflow.sinks.base import Committable, TaskContext
from onceflow.sinks.errors import RowError

pytestmark = pytest.mark.integration

COLUMNS = {"id": "bigint", "amount": "integer"}


def run_epoch(
    kind: str, config: dict[str, Any], rows: list[dict[str, Any]], attempt: str = "a1"
) -> Committable:
    writer = build_writer(kind, config)
    writer.begin(TaskContext("pdirect", 1, 0, "s0-t0", attempt, "out"))
    writer.write(rows)
    return writer.pre_commit()


def table_rows(dsn: str) -> list[tuple[int, int]]:
    """The target's rows; none while the table does not exist yet."""
    with psycopg.connect(dsn) as conn:
        if conn.execute("SELECT to_regclass('out_t')").fetchone() == (None,):
            return []
        rows = conn.execute("SELECT id, amount FROM out_t ORDER BY id, amount").fetchall()
        return [(a, b) for a, b in rows]


def test_plain_sink_writes_during_processing_and_a_replay_duplicates(pg_database: str) -> None:
    config = {"dsn": pg_database, "table": "out_t", "columns": COLUMNS}
    run_epoch("plain", config, [{"id": 1, "amount": 10}, {"id": 2, "amount": 20}])
    assert table_rows(pg_database) == [(1, 10), (2, 20)]  # visible before any commit
    committable = run_epoch("plain", config, [{"id": 1, "amount": 10}, {"id": 2, "amount": 20}], "a2")
    build_committer("plain", config).commit([committable])
    assert table_rows(pg_database) == [(1, 10), (1, 10), (2, 20), (2, 20)]


def test_upsert_sink_collapses_replays_and_duplicate_keys(pg_database: str) -> None:
    config = {
        "dsn": pg_database,
        "table": "out_t",
        "columns": COLUMNS,
        "key_columns": ["id"],
        "batch_size": 2,
    }
    rows = [
        {"id": 1, "amount": 10},
        {"id": 1, "amount": 11},
        {"id": 2, "amount": 20},
        {"id": 3, "amount": 30},
    ]
    first = run_epoch("postgres_upsert", config, rows)
    assert first.record_count == 4
    run_epoch("postgres_upsert", config, rows, "a2")
    build_committer("postgres_upsert", config).commit([first])
    assert table_rows(pg_database) == [(1, 11), (2, 20), (3, 30)]
    with pytest.raises(RowError, match="amount"):
        run_epoch("postgres_upsert", config, [{"id": 4}], "a3")


def test_wal_sink_pushes_on_commit_and_duplicates_after_a_crash_between_push_and_delete(
    pg_database: str, tmp_path: Path
) -> None:
    config = {"dsn": pg_database, "table": "out_t", "columns": COLUMNS, "root": str(tmp_path)}
    committable = run_epoch("wal", config, [{"id": 1, "amount": 10}, {"id": 2, "amount": 20}])
    committer = build_committer("wal", config)
    assert table_rows(pg_database) == []  # kept in the log until commit
    assert [c.task for c in committer.orphans("pdirect")] == ["s0-t0"]

    from onceflow.sinks.wal import WalCommitter

    def crash(step: str) -> None:
        if step == "wal.pushed":
            raise SystemExit("crash after the push, before the log is deleted")

    with pytest.raises(SystemExit):
        WalCommitter(config, crash_hook=crash).commit([committable])
    assert table_rows(pg_database) == [(1, 10), (2, 20)]
    committer.commit([committable])  # recovery: the log is still there, so it is pushed again
    assert table_rows(pg_database) == [(1, 10), (1, 10), (2, 20), (2, 20)]
    committer.commit([committable])  # the log is gone now: nothing more
    assert len(table_rows(pg_database)) == 4
    assert committer.orphans("pdirect") == []


def test_wal_abort_discards_the_log(pg_database: str, tmp_path: Path) -> None:
    config = {"dsn": pg_database, "table": "out_t", "columns": COLUMNS, "root": str(tmp_path)}
    committable = run_epoch("wal", config, [{"id": 1, "amount": 10}])
    committer = build_committer("wal", config)
    committer.abort([committable])
    committer.commit([committable])
    assert table_rows(pg_database) == []

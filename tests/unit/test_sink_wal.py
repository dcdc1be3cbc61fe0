"""The write-ahead-log sink's commit streams a task's log into the table: its memory is one batch of
rows, not the whole log; nested values reach the table as the other PostgreSQL sinks store them."""

from __future__ import annotations

import datetime as dt
import json
import tracemalloc
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from onceflow.sinks import wal
from onceflow.sinks._pg import NestedValues, PgType, row_values
from onceflow.sinks.base import TaskContext
from onceflow.sinks.errors import RowError

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
    log_size = (wal.LocalStaging(tmp_path).for_committable(committable) / wal.LOG).stat().st_size

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


NESTED_ROWS = [
    {
        "id": 1,
        "order": {
            "sku": 'a "quoted",\nü',
            "price": Decimal("-3.30"),
            "ratio": 1e-05,
            "big": 1e16,
            "placed": dt.datetime(2024, 3, 31, 1, 30, 0, 123456, tzinfo=dt.UTC),
            "day": dt.date(1582, 10, 4),
            "raw": b"\x00\xff",
            "flags": [True, None],
        },
        "counts": {"k0": 0, "k1": None, "x y": 2**63 - 1},
        "tags": ["x", None, "a,b", ""],
        "score": 0.1,
    },
    {"id": 2, "order": None, "counts": {}, "tags": [], "score": -2.5},
]
NESTED_TYPES = {
    "id": PgType("bigint", "N"),
    "order": PgType("jsonb", "U"),
    "counts": PgType("json", "U"),
    "tags": PgType("text[]", "A", element=PgType("text", "S")),
    "score": PgType("double precision", "N"),
}


def test_nested_values_reach_psycopg_as_the_other_postgresql_sinks_give_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log holds each nested value as its JSON, exact; the commit gives psycopg, value for value,
    what `NestedValues` gives the direct and two-phase sinks for the same rows (the JSON text of a
    json or jsonb column, a list for an array column; a flat float stays a float)."""
    columns = {
        "id": "bigint",
        "order": "jsonb",
        "counts": "json",
        "tags": "text[]",
        "score": "double precision",
    }
    config = {
        "root": str(tmp_path),
        "dsn": "postgresql://u@127.0.0.1:1/x",
        "table": "t",
        "columns": columns,
        "create_table": False,
    }
    monkeypatch.setattr(psycopg, "connect", lambda *a, **k: FakeConnection())
    monkeypatch.setattr(wal, "table_types", lambda conn, table: NESTED_TYPES)
    monkeypatch.setattr(wal, "table_identifier", lambda name: FakeIdentifier())
    writer = wal.WalWriter(config)
    writer.begin(TaskContext("p", 1, 0, "s0-t0", "a1", "out"))
    writer.write(NESTED_ROWS)
    committable = writer.pre_commit()
    log = (wal.LocalStaging(tmp_path).for_committable(committable) / wal.LOG).read_bytes()
    assert b'"price":-3.30,"ratio":1e-05,"big":1e+16' in log  # exact, as json_text writes it

    pushed: list[tuple[Any, ...]] = []
    monkeypatch.setattr(wal, "insert_rows", lambda conn, statement, rows: pushed.extend(rows))
    monkeypatch.setattr(wal, "insert_statement", lambda table: None)
    wal.WalCommitter(config).commit([committable])
    names = tuple(columns)
    others = NestedValues(names, NESTED_TYPES, "plain sink table t")
    assert pushed == [others.row(row_values(row, names, "plain sink table t")) for row in NESTED_ROWS]
    assert type(pushed[1][4]) is float
    assert json.loads(pushed[0][1])["placed"] == "2024-03-31T01:30:00.123456+00:00"


def test_a_nested_value_that_does_not_fit_its_column_fails_the_write_not_the_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = {
        "root": str(tmp_path),
        "dsn": "postgresql://u@127.0.0.1:1/x",
        "table": "t",
        "create_table": False,
    }
    config["columns"] = {"id": "bigint", "tags": "text[]"}
    monkeypatch.setattr(psycopg, "connect", lambda *a, **k: FakeConnection())
    monkeypatch.setattr(wal, "table_types", lambda conn, table: NESTED_TYPES)
    monkeypatch.setattr(wal, "table_identifier", lambda name: FakeIdentifier())
    writer = wal.WalWriter(config)
    writer.begin(TaskContext("p", 1, 0, "s0-t0", "a1", "out"))
    with pytest.raises(RowError, match=r"^wal sink table t column tags: a struct or map does not fit"):
        writer.write([{"id": 1, "tags": {"a": "b"}}])
    writer.abort()


class FakeIdentifier:
    def as_string(self, conn: Any) -> str:
        return '"t"'

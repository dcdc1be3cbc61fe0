"""postgres_2pc on the real PostgreSQL: Arrow batches through CSV COPY give the table that the same rows
give through the row path, value for value, for every column type a transform hands the sink."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from onceflow.offsets import OffsetRange
from onceflow.sinks.base import TaskContext
from onceflow.sinks.errors import RowError
from onceflow.sinks.postgres_2pc import GID_PREFIX, PostgresTwoPhaseCommitter, PostgresTwoPhaseWriter
from tests.unit.test_sink_batches import every_type_batch

pytestmark = pytest.mark.integration

# Each column of `batch()` and the type the sink config declares for it.
COLUMNS = {
    "id": "bigint PRIMARY KEY",
    "text": "text",
    "big": "bigint",
    "small": "integer",
    "real": "double precision",
    "single": "real",
    "flag": "boolean",
    "blob": "bytea",
    "ts_tz": "timestamptz",
    "ts": "timestamp",
    "day": "date",
    "amount": "numeric(9, 2)",
    "tags": "integer[]",
    # Pairings where Arrow's own text would read back differently: the row path's text is used.
    "ts_tz_wall": "timestamp",
    "real_as_text": "text",
    "real_as_numeric": "numeric",
    "flag_as_text": "text",
    "single_as_double": "double precision",
    "small_as_text": "varchar(40)",
}


def batch(n: int = 64) -> pa.RecordBatch:
    base = every_type_batch(n)
    text = pc.replace_substring(base.column("text"), "\x00", "")  # PostgreSQL text cannot hold NUL
    extra = {
        "ts_tz_wall": base.column("ts_tz"),
        "real_as_text": base.column("real"),
        "real_as_numeric": base.column("real"),
        "flag_as_text": base.column("flag"),
        "single_as_double": base.column("single"),
        "small_as_text": base.column("small"),
    }
    columns = {name: base.column(name) for name in base.schema.names} | {"text": text} | extra
    # Batches from Spark need not be in the table's column order.
    return pa.record_batch({name: columns[name] for name in reversed(list(COLUMNS))})


@pytest.fixture
def pipeline() -> str:
    return f"pgb-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def dsn(pg_database: str, pipeline: str) -> Iterator[str]:
    yield pg_database
    with psycopg.connect(pg_database, autocommit=True) as conn:
        for (gid,) in conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND starts_with(gid, %s)",
            [f"{GID_PREFIX}{pipeline}:"],
        ).fetchall():
            conn.execute(f"ROLLBACK PREPARED '{gid}'")


def stage_and_commit(dsn: str, pipeline: str, table: str, feed: str, pieces: list[pa.RecordBatch]) -> Any:
    config = {"dsn": dsn, "table": table, "columns": COLUMNS, "name": table}
    writer = PostgresTwoPhaseWriter(config)
    writer.begin(TaskContext(pipeline, 1, 0, "s0-t0", "a1", table, (OffsetRange("in", 0, 0, 64),)))
    for piece in pieces:
        if feed == "rows":
            writer.write(piece.to_pylist())
        else:
            writer.write_batch(piece)
    committable = writer.pre_commit()
    PostgresTwoPhaseCommitter(config).commit([committable])
    return committable


def table_text(dsn: str, table: str) -> list[tuple[str, ...]]:
    """Every value as PostgreSQL prints it (NaN, -0, numeric scale and time zones included), or None."""
    names = ", ".join(f"{name}::text" for name in COLUMNS)
    with psycopg.connect(dsn) as conn:
        return [tuple(r) for r in conn.execute(f"SELECT {names} FROM {table} ORDER BY id").fetchall()]


def test_batches_and_rows_give_the_same_table_for_every_column_type(dsn: str, pipeline: str) -> None:
    data = batch()
    pieces = [data.slice(0, 10), data.slice(10, 50), data.slice(60)]
    stage_and_commit(dsn, pipeline, "via_rows", "rows", pieces)
    committable = stage_and_commit(dsn, pipeline, "via_batches", "batches", pieces)
    via_rows, via_batches = table_text(dsn, "via_rows"), table_text(dsn, "via_batches")
    assert len(via_batches) == 64 and committable.record_count == 64
    assert via_batches == via_rows
    with psycopg.connect(dsn) as conn:
        nulls, empties, nan = conn.execute(
            "SELECT count(*) FILTER (WHERE text IS NULL), count(*) FILTER (WHERE text = ''),"
            " count(*) FILTER (WHERE real = 'NaN') FROM via_batches"
        ).fetchone()  # type: ignore[misc]
        first = conn.execute(
            "SELECT big, blob, ts_tz, ts_tz_wall, amount FROM via_batches WHERE id = 4"
        ).fetchone()
    expected = data.to_pylist()
    assert nulls == sum(r["text"] is None for r in expected) > 0
    assert empties == sum(r["text"] == "" for r in expected) > 0
    assert nan == sum(r["real"] is not None and r["real"] != r["real"] for r in expected) > 0
    row = expected[4]
    assert first is not None
    assert first[0] == row["big"] and first[1] == row["blob"] and first[2] == row["ts_tz"]
    assert first[3] == row["ts_tz"].replace(tzinfo=None)  # a timestamp column keeps the wall time
    assert first[4] == row["amount"]


def test_batches_with_wrong_columns_are_refused_and_roll_back(dsn: str, pipeline: str) -> None:
    config = {"dsn": dsn, "table": "t", "columns": {"id": "bigint", "v": "text"}}
    writer = PostgresTwoPhaseWriter(config)
    writer.begin(TaskContext(pipeline, 1, 0, "s0-t0", "a1", "t", (OffsetRange("in", 0, 0, 1),)))
    with pytest.raises(RowError, match=r"missing columns \['v'\] and unknown columns \['w'\]"):
        writer.write_batch(pa.record_batch({"id": [1], "w": ["x"]}))
    writer.abort()
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone() == (0,)

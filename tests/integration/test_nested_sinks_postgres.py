"""Nested values (structs, arrays, maps) into PostgreSQL on the real server: jsonb by default, PostgreSQL
arrays and composite types where the table says so, through rows and through Arrow batches alike, and a
value that does not fit its column refused with one line naming the column."""

from __future__ import annotations

import base64
import datetime as dt
import json
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg.types.composite import CompositeInfo, register_composite

from onceflow.executor.arrow_rows import batch_rows
from onceflow.offsets import OffsetRange
from onceflow.sinks import build_committer, build_writer
from onceflow.sinks.base import TaskContext
from onceflow.sinks.errors import RowError
from onceflow.sinks.postgres_2pc import GID_PREFIX, PostgresTwoPhaseCommitter, PostgresTwoPhaseWriter

pytestmark = pytest.mark.integration

COLUMNS = {
    "id": "bigint PRIMARY KEY",
    "order": "jsonb",  # struct<sku:string,qty:int?,placed:timestamp,price:decimal(10,2)?,meta:struct<...>?>
    "items": "jsonb",  # array<struct<sku:string,qty:int>>?
    "counts": "jsonb",  # map<string,int?>?
    "tags": "text[]",  # array<string?>?
    "scores": "bigint[]",  # array<int>
    "item": "item",  # struct<sku:string,qty:int?>? as a composite type
    "lines": "item[]",  # array<struct<sku:string,qty:int?>>
    "blob": "json",  # struct<data:bytes,day:date>: json keeps the key order as written
}
ITEM = pa.struct([("sku", pa.string()), ("qty", pa.int64())])
# The Arrow types Spark gives these columns (timestamps in UTC, maps as map_, ints as int64).
ARROW = {
    "id": pa.int64(),
    "order": pa.struct(
        [
            ("sku", pa.string()),
            ("qty", pa.int64()),
            ("placed", pa.timestamp("us", "UTC")),
            ("price", pa.decimal128(10, 2)),
            ("meta", pa.struct([("source", pa.string()), ("flags", pa.list_(pa.bool_()))])),
        ]
    ),
    "items": pa.list_(ITEM),
    "counts": pa.map_(pa.string(), pa.int64()),
    "tags": pa.list_(pa.string()),
    "scores": pa.list_(pa.int64()),
    "item": ITEM,
    "lines": pa.list_(ITEM),
    "blob": pa.struct([("data", pa.binary()), ("day", pa.date32())]),
}
PLACED = dt.datetime(2024, 3, 31, 1, 30, 0, 123456, tzinfo=dt.UTC)


def decoded_rows(n: int = 24) -> list[dict[str, Any]]:
    """Rows as the decoders give them (maps are dicts), with nulls at several depths and empty arrays."""
    rows = []
    for i in range(n):
        order = {
            "sku": f'sku-{i}, "quoted"\n{"ü" * (i % 3)}',
            "qty": None if i % 4 == 1 else i * 10,
            "placed": PLACED + dt.timedelta(days=i, microseconds=i),
            "price": None if i % 5 == 2 else Decimal(f"{i}.{i % 10}0") * (-1 if i % 2 else 1),
            "meta": None
            if i % 3 == 0
            else {"source": None if i % 2 else "web", "flags": [True, None][: i % 3]},
        }
        rows.append(
            {
                "id": i,
                "order": order,
                "items": None if i % 6 == 5 else [{"sku": f"a{j}", "qty": j} for j in range(i % 3)],
                "counts": None
                if i % 7 == 6
                else {f"k{j}": (None if j == 1 else j * i) for j in range(1 + i % 3)},
                "tags": None if i % 8 == 7 else ["x", None, "a,b", '{"}', ""][: i % 6],
                "scores": [i, -(2**63), 2**63 - 1][: i % 4],
                "item": None if i % 5 == 4 else {"sku": f"it-{i}", "qty": None if i % 2 else i},
                "lines": [{"sku": "l,(1)", "qty": i}, {"sku": "", "qty": None}][: i % 3],
                "blob": {
                    "data": bytes(range(i % 5)) + b"\x00\xff",
                    "day": dt.date(2024, 2, 29) + dt.timedelta(i),
                },
            }
        )
    return rows


def spark_batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    """The rows as Spark's Arrow conversion hands them to a task: maps as lists of (key, value) pairs."""
    columns = {}
    for name, kind in ARROW.items():
        values = [r[name] for r in rows]
        if pa.types.is_map(kind):
            values = [None if v is None else list(v.items()) for v in values]
        columns[name] = pa.array(values, kind)
    return pa.record_batch(columns)


def as_json(value: Any) -> Any:
    """What the JSON of a row value must read back as (numbers as Decimal: compared exactly)."""
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_json(v) for v in value]
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return value


@pytest.fixture
def pipeline() -> str:
    return f"pgn-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def dsn(pg_database: str, pipeline: str) -> Iterator[str]:
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TYPE item AS (sku text, qty bigint)")
    yield pg_database
    with psycopg.connect(pg_database, autocommit=True) as conn:
        for (gid,) in conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND starts_with(gid, %s)",
            [f"{GID_PREFIX}{pipeline}:"],
        ).fetchall():
            conn.execute(f"ROLLBACK PREPARED '{gid}'")


def task(pipeline: str, sink: str, attempt: str = "a1") -> TaskContext:
    return TaskContext(pipeline, 1, 0, "s0-t0", attempt, sink, (OffsetRange("in", 0, 0, 24),))


def stage_and_commit(dsn: str, pipeline: str, table: str, pieces: list[Any]) -> int:
    """Stage row lists or batches in one prepared transaction, commit it; the committed row count."""
    config = {"dsn": dsn, "table": table, "columns": COLUMNS, "name": table}
    writer = PostgresTwoPhaseWriter(config)
    writer.begin(task(pipeline, table))
    for piece in pieces:
        if isinstance(piece, pa.RecordBatch):
            writer.write_batch(piece)
        else:
            writer.write(piece)
    committable = writer.pre_commit()
    with psycopg.connect(dsn) as conn:  # prepared, not yet visible
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
    PostgresTwoPhaseCommitter(config).commit([committable])
    return committable.record_count


def read_back(dsn: str, table: str) -> list[dict[str, Any]]:
    """The table's rows as Python values: jsonb and json parsed with exact numbers, arrays as lists,
    composites as tuples."""
    with psycopg.connect(dsn) as conn:
        register_composite(CompositeInfo.fetch(conn, "item"), conn)  # type: ignore[arg-type]
        cur = conn.execute(
            f'SELECT id, "order"::text, items::text, counts::text, tags, scores, item, lines, blob::text'
            f" FROM {table} ORDER BY id"
        )
        found = []
        for id_, order, items, counts, tags, scores, item, lines, blob in cur.fetchall():
            parse = lambda text: None if text is None else json.loads(text, parse_float=Decimal)  # noqa: E731
            found.append(
                {
                    "id": id_,
                    "order": parse(order),
                    "items": parse(items),
                    "counts": parse(counts),
                    "tags": tags,
                    "scores": scores,
                    "item": None if item is None else tuple(item),
                    "lines": [tuple(x) for x in lines],
                    "blob": blob,
                }
            )
        return found


def expected(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "id": r["id"],
            "order": as_json(r["order"]),
            "items": as_json(r["items"]),
            "counts": as_json(r["counts"]),
            "tags": r["tags"],
            "scores": r["scores"],
            "item": None if r["item"] is None else (r["item"]["sku"], r["item"]["qty"]),
            "lines": [(x["sku"], x["qty"]) for x in r["lines"]],
            # json keeps the text as sent: keys in field order, compact, bytes base64, dates ISO.
            "blob": json.dumps(as_json(r["blob"]), separators=(",", ":"), ensure_ascii=False),
        }
        for r in rows
    ]


def test_nested_rows_and_batches_store_jsonb_arrays_and_composites(dsn: str, pipeline: str) -> None:
    rows = decoded_rows()
    data = spark_batch(rows)
    pieces = [data.slice(0, 7), data.slice(7, 10), data.slice(17)]
    assert stage_and_commit(dsn, pipeline, "via_rows", [rows[:10], rows[10:]]) == len(rows)
    assert stage_and_commit(dsn, pipeline, "via_batches", pieces) == len(rows)
    assert stage_and_commit(dsn, pipeline, "via_pylist", [p.to_pylist() for p in pieces]) == len(rows)
    via_rows = read_back(dsn, "via_rows")
    assert via_rows == expected(rows)
    assert read_back(dsn, "via_batches") == via_rows
    assert read_back(dsn, "via_pylist") == via_rows
    some = via_rows[3]
    assert some["order"]["placed"] == "2024-04-03T01:30:00.123459+00:00"
    assert str(some["order"]["price"]) == "-3.30"  # exact, scale kept: never through a float
    assert {r["order"]["meta"] is None for r in via_rows} == {True, False}
    assert [] in [r["items"] for r in via_rows] and None in [r["items"] for r in via_rows]
    assert [] in [r["tags"] for r in via_rows] and ["x", None] in [r["tags"] for r in via_rows]
    assert {"k0": 0, "k1": None} in [r["counts"] for r in via_rows]


def test_the_batch_path_stages_what_its_rows_stage_byte_for_byte(dsn: str, pipeline: str) -> None:
    """Every column as PostgreSQL prints it: the CSV COPY of a batch and the COPY of its rows agree."""
    data = spark_batch(decoded_rows())
    stage_and_commit(dsn, pipeline, "b", [data])
    stage_and_commit(dsn, pipeline, "r", [data.to_pylist()])
    names = ", ".join(f'"{n}"::text' for n in COLUMNS)
    with psycopg.connect(dsn) as conn:
        via_batch = conn.execute(f"SELECT {names} FROM b ORDER BY id").fetchall()
        via_rows = conn.execute(f"SELECT {names} FROM r ORDER BY id").fetchall()
    assert via_batch == via_rows and len(via_batch) == 24


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("scores", {"a": 1}, r"column scores: a struct or map does not fit a column of type bigint\[\]"),
        ("scores", [1, "2"], r"column scores\[1\]: str '2' does not fit type bigint"),
        ("item", {"sku": "x", "qty": 1, "colour": "red"}, r"column item: .*unknown fields \['colour'\]"),
        ("item", {"sku": "x", "qty": "1"}, r"column item\.qty: str '1' does not fit type bigint"),
        ("order", {"price": float("nan")}, r"column order\.price: nan has no JSON number"),
        ("items", [{"sku": "a\x00b"}], r"column items\[0\]\.sku: text with a NUL character"),
    ],
)
def test_a_value_that_does_not_fit_is_one_line_naming_the_column(
    dsn: str, pipeline: str, column: str, value: Any, message: str
) -> None:
    row = decoded_rows(1)[0] | {column: value}
    config = {"dsn": dsn, "table": "t", "columns": COLUMNS}
    writer = PostgresTwoPhaseWriter(config)
    writer.begin(task(pipeline, "t"))
    with pytest.raises(RowError, match=message) as raised:
        writer.write([row])
    assert "\n" not in str(raised.value)
    assert str(raised.value).startswith("postgres_2pc sink t table t column ")
    writer.abort()
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,)


def test_a_batch_column_that_does_not_fit_is_refused_as_its_rows_are(dsn: str, pipeline: str) -> None:
    data = spark_batch(decoded_rows(3)).set_column(
        5, "scores", pa.array([["1.5"], [], None], pa.list_(pa.string()))
    )
    messages = []
    for feed in ("batch", "rows"):
        writer = PostgresTwoPhaseWriter({"dsn": dsn, "table": "t", "columns": COLUMNS})
        writer.begin(task(pipeline, "t", attempt=f"a-{feed}"))
        with pytest.raises(RowError) as raised:
            if feed == "batch":
                writer.write_batch(data)
            else:
                writer.write(data.to_pylist())
        messages.append(str(raised.value))
        writer.abort()
    assert messages[0] == messages[1]
    assert "column scores[0]: str '1.5' does not fit type bigint" in messages[0]


@pytest.mark.parametrize("kind", ["plain", "postgres_upsert", "wal"])
def test_direct_sinks_store_nested_values_as_the_two_phase_sink_does(
    dsn: str, pipeline: str, kind: str, tmp_path: Path
) -> None:
    """The direct sinks, and the write-ahead-log sink (which pushes its log at commit)."""
    rows = decoded_rows(12)
    config: dict[str, Any] = {"dsn": dsn, "table": "direct", "columns": COLUMNS, "batch_size": 5}
    if kind == "postgres_upsert":
        config |= {"key_columns": ["id"], "columns": COLUMNS | {"id": "bigint"}}
    if kind == "wal":
        config |= {"root": str(tmp_path / "wal")}
    writer = build_writer(kind, config)
    writer.begin(task(pipeline, "direct"))
    writer.write(rows)
    build_committer(kind, config).commit([writer.pre_commit()])
    assert read_back(dsn, "direct") == expected(rows)
    writer = build_writer(kind, config)
    writer.begin(task(pipeline, "direct", attempt="a2"))
    with pytest.raises(RowError, match=r"^plain|^postgres_upsert|^wal") as raised:
        writer.write([rows[0] | {"id": 99, "lines": {"sku": "x"}}])
    assert f"{kind} sink table direct column lines: a struct or map does not fit" in str(raised.value)
    writer.abort()


def test_the_wal_sink_stores_a_tasks_batches_as_the_two_phase_sink_stores_them(
    dsn: str, pipeline: str, tmp_path: Path
) -> None:
    """A write task turns Spark's batches into rows for the wal sink (maps as dicts); its log holds the
    nested values as JSON, exact, and the commit stores each column as the two-phase sink does, the
    row-typed columns too; nothing is in the table before the commit."""
    rows = decoded_rows()
    data = spark_batch(rows)
    stage_and_commit(dsn, pipeline, "two_phase", [data])
    config = {"dsn": dsn, "table": "logged", "columns": COLUMNS, "root": str(tmp_path / "wal")}
    writer = build_writer("wal", config)
    writer.begin(task(pipeline, "logged"))
    for piece in (data.slice(0, 10), data.slice(10)):
        writer.write(list(batch_rows([piece])))
    committable = writer.pre_commit()
    with psycopg.connect(dsn) as conn:  # the writer made the table to check the values: still empty
        assert conn.execute("SELECT count(*) FROM logged").fetchone() == (0,)
    build_committer("wal", config).commit([committable])
    assert committable.record_count == len(rows)
    assert read_back(dsn, "logged") == read_back(dsn, "two_phase") == expected(rows)
    names = ", ".join(f'"{n}"::text' for n in COLUMNS)
    with psycopg.connect(dsn) as conn:
        logged = conn.execute(f"SELECT {names} FROM logged ORDER BY id").fetchall()
        assert logged == conn.execute(f"SELECT {names} FROM two_phase ORDER BY id").fetchall()

    typed = {"id": "bigint", "events": "array<struct<kind:string,doc:json?>>?", "attrs": "map<string,json>"}
    config = {"dsn": dsn, "table": "typed_log", "columns": typed, "root": str(tmp_path / "wal2")}
    writer = build_writer("wal", config)
    writer.begin(task(pipeline, "typed_log"))
    writer.write(
        [
            {
                "id": 1,
                "events": [{"kind": "a", "doc": '{"x":[1,2.50]}'}, {"kind": "b", "doc": None}],
                "attrs": {},
            },
            {"id": 2, "events": None, "attrs": {"n": "3", "s": '"text"'}},
        ]
    )
    build_committer("wal", config).commit([writer.pre_commit()])
    with psycopg.connect(dsn) as conn:
        found = conn.execute("SELECT id, events::text, attrs::text FROM typed_log ORDER BY id").fetchall()
    assert found == [
        (1, '[{"doc": {"x": [1, 2.50]}, "kind": "a"}, {"doc": null, "kind": "b"}]', "{}"),
        (2, None, '{"n": 3, "s": "text"}'),
    ]


def test_columns_declared_by_row_type_are_jsonb_with_json_fields_as_documents(
    dsn: str, pipeline: str
) -> None:
    columns = {"id": "bigint", "events": "array<struct<kind:string,doc:json?>>?", "attrs": "map<string,json>"}
    rows = [
        {
            "id": 1,
            "events": [{"kind": "a", "doc": '{"x":[1,2.50]}'}, {"kind": "b", "doc": None}],
            "attrs": {},
        },
        {"id": 2, "events": None, "attrs": {"n": "3", "s": '"text"'}},
        {"id": 3, "events": [], "attrs": {"deep": '{"a":{"b":null}}'}},
    ]
    kinds = {
        "id": pa.int64(),
        "events": pa.list_(pa.struct([("kind", pa.string()), ("doc", pa.string())])),
        "attrs": pa.map_(pa.string(), pa.string()),
    }
    batch = pa.record_batch(
        {
            name: pa.array([list(r[name].items()) if name == "attrs" else r[name] for r in rows], kind)
            for name, kind in kinds.items()
        }
    )
    found = {}
    for table, piece in (("typed_rows", rows), ("typed_batch", batch)):
        config = {"dsn": dsn, "table": table, "columns": columns}
        writer = PostgresTwoPhaseWriter(config)
        writer.begin(task(pipeline, table))
        if isinstance(piece, pa.RecordBatch):
            writer.write_batch(piece)
        else:
            writer.write(piece)
        PostgresTwoPhaseCommitter(config).commit([writer.pre_commit()])
        with psycopg.connect(dsn) as conn:
            types = conn.execute(
                "SELECT attname, atttypid::regtype::text FROM pg_attribute"
                " WHERE attrelid = %s::regclass AND attnum > 0 ORDER BY attnum",
                [table],
            ).fetchall()
            assert types == [("id", "bigint"), ("events", "jsonb"), ("attrs", "jsonb")]
            found[table] = [
                (
                    i,
                    None if e is None else json.loads(e, parse_float=Decimal),
                    json.loads(a, parse_float=Decimal),
                )
                for i, e, a in conn.execute(f"SELECT id, events::text, attrs::text FROM {table} ORDER BY id")
            ]
    assert found["typed_rows"] == [
        (1, [{"kind": "a", "doc": {"x": [1, Decimal("2.50")]}}, {"kind": "b", "doc": None}], {}),
        (2, None, {"n": 3, "s": "text"}),
        (3, [], {"deep": {"a": {"b": None}}}),
    ]
    # The batch's empty map arrives as Arrow's empty list of pairs: the row type makes it {} again.
    assert found["typed_batch"] == found["typed_rows"]
    writer = PostgresTwoPhaseWriter({"dsn": dsn, "table": "typed_rows", "columns": columns})
    writer.begin(task(pipeline, "typed_rows", attempt="a2"))
    with pytest.raises(
        RowError, match=r"column attrs\.bad: a json field holds text that is not JSON \(Expecting"
    ):
        writer.write([{"id": 4, "events": None, "attrs": {"bad": "{oops"}}])
    writer.abort()

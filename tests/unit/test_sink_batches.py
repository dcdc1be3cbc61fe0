"""Writers fed Arrow batches stage exactly what they stage when fed the same rows (files, Kafka), and a
writer that takes only rows still works behind a Spark task's batches."""

from __future__ import annotations

import datetime as dt
import hashlib
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onceflow.config import Settings
from onceflow.executor.slices import SliceRef
from onceflow.executor.writing import write_task_batches
from onceflow.offsets import OffsetRange
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.sinks.base import Committable, TaskContext
from onceflow.sinks.errors import RowError
from onceflow.sinks.files import FilesWriter
from onceflow.sinks.kafka import KafkaWriter, read_records
from onceflow.sinks.registry import SinkKind

PARIS = "Europe/Paris"
OLD_PARIS = dt.datetime(1890, 6, 1, 12, 0, 0, tzinfo=dt.UTC)  # Paris was 9 min 21 s ahead of UTC
TRICKY_TEXT = [
    "",
    'say "hi"',
    "a,b",
    "line\nbreak\r\n",
    "tab\there",
    "ünïcødé ✓ 𝄞",
    "\\.",
    "\x00\x1f\x7f",
    "\u2028",
]
TRICKY_FLOATS = [
    0.0,
    -0.0,
    0.1,
    1e16,
    1.5e-7,
    100.0,
    1 / 3,
    float("nan"),
    float("inf"),
    float("-inf"),
    5e-324,
]
BIG_INTS = [0, 1, -1, 2**63 - 1, -(2**63), 2**53 + 1]


def task(sink: str = "out", attempt: str = "a1") -> TaskContext:
    return TaskContext("p", 1, 0, "s0-t0", attempt, sink, (OffsetRange("in", 0, 0, 3),))


def every_type_batch(n: int = 40) -> pa.RecordBatch:
    """A batch with every column type a transform hands the sinks, nulls and awkward values included."""
    moment = dt.datetime(2024, 3, 31, 1, 30, 0, 123456, tzinfo=dt.UTC)

    def pick(values: list[Any], i: int) -> Any:
        return None if i % 7 == 3 else values[i % len(values)]

    rows = range(n)
    return pa.record_batch(
        {
            "id": pa.array(list(rows), pa.int64()),
            "text": pa.array([pick(TRICKY_TEXT, i) for i in rows], pa.string()),
            "big": pa.array([pick(BIG_INTS, i) for i in rows], pa.int64()),
            "small": pa.array([pick([1, -7, 2**31 - 1], i) for i in rows], pa.int32()),
            "real": pa.array([pick(TRICKY_FLOATS, i) for i in rows], pa.float64()),
            "single": pa.array([pick([0.1, 3.5, float("nan")], i) for i in rows], pa.float32()),
            "flag": pa.array([pick([True, False], i) for i in rows], pa.bool_()),
            "blob": pa.array([pick([b"", b"\x00\xff", b'q"\n,'], i) for i in rows], pa.binary()),
            "ts_tz": pa.array(
                [pick([moment, moment + dt.timedelta(hours=i), OLD_PARIS], i) for i in rows],
                pa.timestamp("us", PARIS),
            ),
            "ts": pa.array([pick([moment.replace(tzinfo=None)], i) for i in rows], pa.timestamp("us")),
            "day": pa.array([pick([dt.date(2024, 2, 29), dt.date(1, 1, 1)], i) for i in rows], pa.date32()),
            "amount": pa.array(
                [pick([Decimal("1.50"), Decimal("-0.01")], i) for i in rows], pa.decimal128(9, 2)
            ),
            "tags": pa.array([pick([[1, 2], []], i) for i in rows], pa.list_(pa.int32())),
        }
    )


def stage_files(
    root: Path, feed: str, batches: list[pa.RecordBatch], **config: Any
) -> tuple[bytes, Committable]:
    declared = {"columns": config["columns"]} if config.get("columns") else {}
    writer = FilesWriter({"root": str(root), "table": "t", "batch_size": 25, "name": "out", **declared})
    writer.begin(task())
    for batch in batches:
        if feed == "rows":
            writer.write(batch.to_pylist())
        else:
            writer.write_batch(batch)
    committable = writer.pre_commit()
    part = next(root.glob("_staging/**/part-00000.parquet"))
    return part.read_bytes(), committable


@pytest.mark.parametrize(
    "columns",
    [
        {},
        {
            "id": "int64",
            "text": "large_string",
            "big": "int64",
            "small": "int64",
            "real": "float32",
            "flag": "bool",
        },
    ],
)
def test_parquet_from_batches_is_the_parquet_from_rows_byte_for_byte(
    tmp_path: Path, columns: dict[str, str]
) -> None:
    batch = every_type_batch(60)
    if columns:
        batch = batch.select(list(columns))
    pieces = [batch.slice(0, 7), batch.slice(7, 30), batch.slice(37)]  # row groups span batches
    from_rows, by_rows = stage_files(tmp_path / "rows", "rows", pieces, columns=columns)
    from_batches, by_batches = stage_files(tmp_path / "batches", "batches", pieces, columns=columns)
    assert hashlib.sha256(from_batches).hexdigest() == hashlib.sha256(from_rows).hexdigest()
    assert by_batches == by_rows
    assert by_rows.checksum == by_rows.handle["files"][0]["sha256"]
    staged = pq.ParquetFile(next((tmp_path / "batches").glob("_staging/**/part-00000.parquet")))
    assert [staged.metadata.row_group(i).num_rows for i in range(staged.num_row_groups)] == [25, 25, 10]
    assert staged.read().column("id").to_pylist() == list(range(60))


def test_a_task_without_rows_stages_no_file_either_way(tmp_path: Path) -> None:
    writer = FilesWriter({"root": str(tmp_path), "table": "t"})
    writer.begin(task())
    committable = writer.pre_commit()
    assert committable.handle["files"] == [] and committable.record_count == 0
    assert committable.checksum == hashlib.sha256(b"").hexdigest()


def test_files_batches_with_wrong_columns_are_refused_like_rows(tmp_path: Path) -> None:
    writer = FilesWriter({"root": str(tmp_path), "table": "t", "columns": {"a": "int64", "b": "string"}})
    writer.begin(task())
    with pytest.raises(RowError, match=r"missing columns \['b'\] and unknown columns \['c'\]"):
        writer.write_batch(pa.record_batch({"a": [1], "c": ["x"]}))
    with pytest.raises(RowError, match="rows do not fit"):
        writer.write_batch(pa.record_batch({"a": ["not a number"], "b": ["x"]}))
    with pytest.raises(RowError, match="duplicate columns"):
        writer.write_batch(pa.RecordBatch.from_arrays([pa.array([1]), pa.array([2])], names=["a", "a"]))
    writer.abort()


def stage_kafka(
    root: Path, feed: str, batches: list[pa.RecordBatch], **config: Any
) -> tuple[bytes, Committable]:
    writer = KafkaWriter(
        {"topic": "t", "staging_root": str(root), "bootstrap": "h:1", "name": "out", **config}
    )
    writer.begin(task())
    for batch in batches:
        if feed == "rows":
            writer.write(batch.to_pylist())
        else:
            writer.write_batch(batch)
    committable = writer.pre_commit()
    return next(root.glob("_staging/**/records.bin")).read_bytes(), committable


@pytest.mark.parametrize("key_column", [None, "text", "id", "flag", "real", "ts_tz"])
def test_kafka_json_records_from_batches_are_the_rows_records(tmp_path: Path, key_column: str | None) -> None:
    batch = every_type_batch(50)
    pieces = [batch.slice(0, 20), batch.slice(20)]
    config = {"value_format": "json", "key_column": key_column}
    from_rows, by_rows = stage_kafka(tmp_path / "rows", "rows", pieces, **config)
    from_batches, by_batches = stage_kafka(tmp_path / "batches", "batches", pieces, **config)
    assert from_batches == from_rows
    assert by_batches == by_rows
    assert len(list(read_records(next((tmp_path / "batches").glob("_staging/**/records.bin"))))) == 50


def test_kafka_raw_records_from_batches_are_the_rows_records(tmp_path: Path) -> None:
    keyed = pa.record_batch({"key": ["k", None, "ключ", ""], "value": [b"v", b"", b"\x00", b"x" * 300]})
    text_values = pa.record_batch({"value": ["é", "", "a\nb"]})
    for name, batch in {"keyed": keyed, "unkeyed": text_values}.items():
        from_rows, _ = stage_kafka(tmp_path / name / "rows", "rows", [batch])
        from_batches, _ = stage_kafka(tmp_path / name / "batches", "batches", [batch])
        assert from_batches == from_rows


def test_kafka_raw_batches_with_bad_columns_are_refused(tmp_path: Path) -> None:
    writer = KafkaWriter({"topic": "t", "staging_root": str(tmp_path), "bootstrap": "h:1"})
    writer.begin(task())
    with pytest.raises(RowError, match="'value' and optional 'key'"):
        writer.write_batch(pa.record_batch({"value": [b"v"], "topic": ["x"]}))
    with pytest.raises(RowError, match="value must be bytes or str"):
        writer.write_batch(pa.record_batch({"value": [5]}))
    with pytest.raises(RowError, match="value must be bytes or str"):
        writer.write_batch(pa.record_batch({"value": pa.array([None, b"x"], pa.binary())}))
    writer.abort()


json_scalars = st.one_of(
    st.none(),
    st.text(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(
    texts=st.lists(st.one_of(st.none(), st.text()), min_size=1, max_size=12),
    ints=st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), min_size=12, max_size=12),
    floats=st.lists(st.one_of(st.none(), st.floats()), min_size=12, max_size=12),
)
def test_any_text_int_and_float_encode_as_pythons_json(
    tmp_path_factory: pytest.TempPathFactory,
    texts: list[str | None],
    ints: list[int | None],
    floats: list[float | None],
) -> None:
    n = len(texts)
    batch = pa.record_batch(
        {"s": pa.array(texts, pa.string()), "i": pa.array(ints[:n], pa.int64()), "f": pa.array(floats[:n])}
    )
    root = tmp_path_factory.mktemp("k")
    config = {"value_format": "json", "key_column": "s"}
    assert (
        stage_kafka(root / "b", "batches", [batch], **config)[0]
        == stage_kafka(root / "r", "rows", [batch], **config)[0]
    )


# A sink kind of a user's own package: its writer takes rows only.
class RowsOnlyWriter:
    written: ClassVar[list[list[dict[str, Any]]]] = []

    def __init__(self, config: Any) -> None:
        self.task: TaskContext | None = None

    def begin(self, task: TaskContext) -> None:
        self.task = task

    def write(self, rows: Any) -> None:
        RowsOnlyWriter.written.append(list(rows))

    def pre_commit(self) -> Committable:
        assert self.task is not None
        return Committable.for_task(self.task, record_count=sum(len(r) for r in RowsOnlyWriter.written))

    def abort(self) -> None:
        return None


ROWS_ONLY = SinkKind(
    name="rows_only", writer=RowsOnlyWriter, committer=lambda c: None, guarantee="at_least_once"
)  # type: ignore[arg-type,return-value]


def test_a_writer_without_write_batch_gets_the_batches_rows_once(tmp_path: Path) -> None:
    RowsOnlyWriter.written.clear()
    sink = SinkSpec("out", f"{__name__}:ROWS_ONLY", {})
    spec = Pipeline("p", KafkaSource(("in",)), JsonFormat({"n": "int"}), (sink,))
    ref = SliceRef(spec, 1, 0, (OffsetRange("in", 0, 0, 3),), "127.0.0.1:1", settings=Settings.from_env({}))
    batches = [
        pa.record_batch({"n": [1, 2]}),
        pa.record_batch({"n": pa.array([], pa.int64())}),
        pa.record_batch({"n": [3]}),
    ]
    report = write_task_batches(ref, sink, "s0-t0", "a1", iter(batches))
    assert report.records == 3
    assert RowsOnlyWriter.written == [[{"n": 1}, {"n": 2}, {"n": 3}]]
    assert report.to_committable().record_count == 3


@pytest.mark.parametrize("feed", ["rows", "batches"])
def test_decimals_keep_one_type_across_row_groups_whatever_their_values(tmp_path: Path, feed: str) -> None:
    """Avro decimals: small values first, then larger ones, must not change the staged file's schema."""
    values = [[Decimal("0.25")] * 30, [Decimal("123456.50")] * 30]
    writer = FilesWriter({"root": str(tmp_path), "table": "t", "batch_size": 25})
    writer.begin(task())
    for chunk in values:
        if feed == "rows":
            writer.write([{"amount": v} for v in chunk])
        else:
            writer.write_batch(pa.record_batch({"amount": pa.array(chunk, pa.decimal128(9, 2))}))
    committable = writer.pre_commit()
    assert committable.record_count == 60
    part = next(tmp_path.glob("_staging/**/part-00000.parquet"))
    column = pq.read_table(part).column("amount")
    assert column.type == pa.decimal128(38, 2)  # the same from rows and from batches
    assert column.to_pylist() == values[0] + values[1]

"""The Iceberg sink against a real pyiceberg SQL catalog (SQLite) and local warehouse: one snapshot per
epoch, idempotent commits that survive snapshot expiry, abort and sweep that never touch a committed
file, replace of a re-run interval, schema checks at plan time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from onceflow.committables import Committable, TaskContext
from onceflow.errors import ConfigError
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.sinks import iceberg
from onceflow.sinks.errors import AlreadyCommitted, StagedOutputLost

PIPELINE = "clicks_ice"


@pytest.fixture()
def config(tmp_path: Path) -> dict[str, Any]:
    return {
        "name": "lake",
        "table": "web.clicks",
        "catalog": f"test_{tmp_path.name}",
        "catalog_properties": iceberg.default_catalog_properties(tmp_path),
        "columns": {"user": "string", "n": "long"},
        "rows_per_file": 3,
    }


def _spec(config: dict[str, Any], **kwargs: Any) -> Pipeline:
    sink_config = {k: v for k, v in config.items() if k != "name"}
    return Pipeline(
        name=PIPELINE,
        source=KafkaSource(topics=("clicks",)),
        format=JsonFormat(schema={"user": "string", "n": "int"}),
        sinks=(SinkSpec("lake", "iceberg", sink_config),),
        **kwargs,
    )


def _stage(
    config: dict[str, Any],
    epoch: int,
    task: str,
    rows: list[dict[str, Any]],
    attempt: str = "0",
    replaces: tuple[int, ...] = (),
    pipeline: str = PIPELINE,
) -> Committable:
    writer = iceberg.IcebergWriter(config)
    writer.begin(TaskContext(pipeline, epoch, 0, task, attempt, config["name"], replaces=replaces))
    writer.write(rows)
    return writer.pre_commit()


def _table(config: dict[str, Any]) -> Any:
    table = iceberg.IcebergConfig.from_mapping(config)
    return iceberg.tables.load(table.open_catalog(), table.table)


def _rows(config: dict[str, Any]) -> list[tuple[str, int]]:
    return sorted((r["user"], r["n"]) for r in _table(config).scan().to_arrow().to_pylist())


def test_an_epoch_of_two_tasks_is_one_snapshot_and_a_second_commit_changes_nothing(
    config: dict[str, Any],
) -> None:
    iceberg.plan_checks(_spec(config), [config], 2)
    a = _stage(config, 1, "s0-t0", [{"user": f"a{i}", "n": i} for i in range(7)])
    b = _stage(config, 1, "s0-t1", [{"user": "b", "n": 100}])
    assert len(a.handle["files"]) == 3  # 7 rows, 3 per file
    assert sum(f["record_count"] for f in a.handle["files"]) == 7
    assert _table(config).scan().to_arrow().num_rows == 0  # staged: no snapshot references them

    committer = iceberg.IcebergCommitter(config)
    committer.commit([a, b])
    committer.commit([a, b])
    committer.commit([b])
    table = _table(config)
    assert len(table.snapshots()) == 1
    summary = table.current_snapshot().summary
    assert summary[iceberg.SUMMARY_PIPELINE] == PIPELINE
    assert summary[iceberg.SUMMARY_EPOCH] == "1"
    assert summary["added-records"] == "8"
    assert table.properties[iceberg.committed_property(PIPELINE, "lake")] == "1"
    assert _rows(config) == sorted([(f"a{i}", i) for i in range(7)] + [("b", 100)])
    assert committer.orphans(PIPELINE) == []  # the markers went with the commit


def test_column_statistics_travel_in_the_committable(config: dict[str, Any]) -> None:
    iceberg.plan_checks(_spec(config), [config], 1)
    c = _stage(config, 1, "s0-t0", [{"user": "x", "n": 5}, {"user": "y", "n": None}])
    iceberg.IcebergCommitter(config).commit([c])
    table = _table(config)
    (task,) = list(table.scan(row_filter="n >= 5").plan_files())
    n_id = table.schema().find_field("n").field_id
    assert task.file.null_value_counts[n_id] == 1
    assert task.file.record_count == 2
    assert list(table.scan(row_filter="n > 5").plan_files()) == []  # pruned by the upper bound


def test_the_marker_survives_snapshot_expiry(config: dict[str, Any]) -> None:
    iceberg.plan_checks(_spec(config), [config], 1)
    committer = iceberg.IcebergCommitter(config)
    staged = [_stage(config, n, "s0-t0", [{"user": "u", "n": n}]) for n in (1, 2, 3)]
    for c in staged:
        committer.commit([c])
    table = _table(config)
    keep = table.current_snapshot().snapshot_id
    table.maintenance.expire_snapshots().by_ids(
        [s.snapshot_id for s in table.snapshots() if s.snapshot_id != keep]
    ).commit()
    assert len(_table(config).snapshots()) == 1
    for c in staged:  # a sweeper's or an operator's repeated commit after expiry
        committer.commit([c])
    assert _rows(config) == [("u", 1), ("u", 2), ("u", 3)]


def test_abort_deletes_unreferenced_files_and_refuses_committed_ones(config: dict[str, Any]) -> None:
    iceberg.plan_checks(_spec(config), [config], 1)
    committer = iceberg.IcebergCommitter(config)
    winner = _stage(config, 1, "s0-t0", [{"user": "w", "n": 1}], attempt="0")
    loser = _stage(config, 1, "s0-t0", [{"user": "l", "n": 2}], attempt="1")
    assert {c.attempt for c in committer.orphans(PIPELINE)} == {"0", "1"}
    committer.commit([winner])
    committer.abort([loser])
    assert not any(Path(f["path"].removeprefix("file://")).exists() for f in loser.handle["files"])
    with pytest.raises(AlreadyCommitted):
        committer.abort([winner])
    assert all(Path(f["path"].removeprefix("file://")).exists() for f in winner.handle["files"])
    assert _rows(config) == [("w", 1)]
    assert committer.orphans(PIPELINE) == []


def test_a_crash_before_pre_commit_leaves_an_incomplete_attempt_that_abort_removes(
    config: dict[str, Any],
) -> None:
    iceberg.plan_checks(_spec(config), [config], 1)
    writer = iceberg.IcebergWriter(config)
    writer.begin(TaskContext(PIPELINE, 4, 0, "s0-t0", "9", "lake"))
    writer.write([{"user": f"c{i}", "n": i} for i in range(5)])  # one file of 3 rows flushed
    committer = iceberg.IcebergCommitter(config)
    (orphan,) = committer.orphans(PIPELINE)
    assert orphan.handle == {"incomplete": True} and orphan.epoch == 4
    with pytest.raises(StagedOutputLost):
        committer.commit([orphan])
    committer.abort([orphan])
    assert committer.orphans(PIPELINE) == []
    data = Path(str(_table(config).location()).removeprefix("file://")) / "data"
    assert [p for p in data.rglob("*.parquet")] == []


def test_a_lost_data_file_is_never_committed_silently(config: dict[str, Any]) -> None:
    iceberg.plan_checks(_spec(config), [config], 1)
    c = _stage(config, 1, "s0-t0", [{"user": "u", "n": 1}])
    Path(c.handle["files"][0]["path"].removeprefix("file://")).unlink()
    with pytest.raises(StagedOutputLost, match="data files are gone"):
        iceberg.IcebergCommitter(config).commit([c])


def test_a_re_run_interval_replaces_its_rows_in_one_snapshot(config: dict[str, Any]) -> None:
    iceberg.plan_checks(_spec(config), [config], 1)
    committer = iceberg.IcebergCommitter(config)
    committer.commit([_stage(config, 1, "s0-t0", [{"user": "old", "n": 1}, {"user": "old", "n": 2}])])
    committer.commit([_stage(config, 2, "s0-t0", [{"user": "other", "n": 3}])])
    rerun = _stage(config, 3, "s0-t0", [{"user": "new", "n": 1}, {"user": "new", "n": 2}], replaces=(1,))
    committer.commit([rerun])
    committer.commit([rerun])
    table = _table(config)
    assert len(table.snapshots()) == 3
    assert table.current_snapshot().summary.operation.value == "overwrite"
    assert table.current_snapshot().summary[iceberg.SUMMARY_REPLACES] == "1"
    assert _rows(config) == [("new", 1), ("new", 2), ("other", 3)]


def test_plan_time_schema_checks(config: dict[str, Any]) -> None:
    iceberg.plan_checks(_spec(config), [config], 1)
    with pytest.raises(ConfigError, match=r"n is long in the table, string here") as refused:
        iceberg.plan_checks(_spec(config), [{**config, "columns": {"user": "string", "n": "string"}}], 1)
    assert "\n" not in str(refused.value)
    widened = {**config, "columns": {"user": "string", "n": "long", "country": "string"}}
    iceberg.plan_checks(_spec(config), [widened], 1)  # a new nullable column is added
    assert [f.name for f in _table(config).schema().fields] == ["user", "n", "country"]
    assert not _table(config).schema().find_field("country").required
    c = _stage(widened, 1, "s0-t0", [{"user": "u", "n": 1, "country": "pt"}])
    iceberg.IcebergCommitter(widened).commit([c])
    with pytest.raises(ConfigError, match="partition transform"):
        fresh = {**config, "table": "web.other", "partition_by": {"n": "weekly"}}
        iceberg.plan_checks(_spec(config), [fresh], 1)


def test_without_columns_the_table_takes_the_decoded_rows_or_the_first_rows(config: dict[str, Any]) -> None:
    undeclared = {k: v for k, v in config.items() if k != "columns"}
    iceberg.plan_checks(_spec(undeclared), [undeclared], 1)
    names = [f.name for f in _table(undeclared).schema().fields]
    assert names == ["user", "n", "_topic", "_partition", "_offset", "_timestamp"]

    later = {**undeclared, "table": "web.from_rows", "partition_by": {"day": "identity"}}
    iceberg.plan_checks(_spec(later, transform="examples.orders.transform:enrich"), [later], 1)
    assert _table(later) is None  # only the transform's output will tell
    c = _stage(later, 1, "s0-t0", [{"day": "2026-01-01", "hits": 3}, {"day": "2026-01-02", "hits": 4}])
    assert len(c.handle["files"]) == 2  # one per partition
    iceberg.IcebergCommitter(later).commit([c])
    table = _table(later)
    assert [str(f.field_type) for f in table.schema().fields] == ["string", "long"]
    second_day = table.scan(row_filter="day == '2026-01-02'").to_arrow().to_pylist()
    assert [r["hits"] for r in second_day] == [4]
    # A transform that starts emitting a new column: the table gains it as a nullable column.
    wider = _stage(later, 2, "s0-t0", [{"day": "2026-01-03", "hits": 5, "country": "pt"}])
    iceberg.IcebergCommitter(later).commit([wider])
    rows = sorted(_table(later).scan().to_arrow().to_pylist(), key=lambda r: r["day"])
    assert [r["country"] for r in rows] == [None, None, "pt"]


def test_spark_reads_the_sql_catalog_through_iceberg_jdbc_catalog() -> None:
    from onceflow.sinks.iceberg.spark import spark_conf

    sqlite = spark_conf("onceflow", {"type": "sql", "uri": "sqlite:////srv/home/iceberg/catalog.db"}, "a.jar")
    assert sqlite["spark.sql.catalog.onceflow.uri"] == "jdbc:sqlite:/srv/home/iceberg/catalog.db"
    assert sqlite["spark.sql.catalog.onceflow.catalog-impl"] == "org.apache.iceberg.jdbc.JdbcCatalog"
    pg = spark_conf("lake", {"type": "sql", "uri": "postgresql+psycopg://u:p%40ss@db:5433/cat"}, "a.jar")
    assert pg["spark.sql.catalog.lake.uri"] == "jdbc:postgresql://db:5433/cat"
    assert (pg["spark.sql.catalog.lake.jdbc.user"], pg["spark.sql.catalog.lake.jdbc.password"]) == (
        "u",
        "p@ss",
    )
    with pytest.raises(ConfigError, match="type 'rest'"):
        spark_conf("lake", {"type": "rest", "uri": "http://x"}, "a.jar")


def test_a_conflicting_commit_is_retried_and_a_racing_copy_of_the_same_epoch_adds_nothing(
    config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    iceberg.plan_checks(_spec(config), [config], 1)
    ours = _stage(config, 1, "s0-t0", [{"user": "ours", "n": 1}])
    other_config = {**config, "name": "other"}
    theirs = _stage(other_config, 7, "s0-t0", [{"user": "theirs", "n": 2}], pipeline="another")
    committer = iceberg.IcebergCommitter(config)
    original = iceberg.IcebergCommitter._one_commit
    interleaved: list[str] = []

    def another_writer_first(self: Any, table: Any, *args: Any) -> None:
        if not interleaved:  # between our read of the table and our commit, another writer commits
            interleaved.append("theirs")
            iceberg.IcebergCommitter(other_config).commit([theirs])
        original(self, table, *args)

    monkeypatch.setattr(iceberg.IcebergCommitter, "_one_commit", another_writer_first)
    committer.commit([ours])
    table = _table(config)
    assert [s.summary[iceberg.SUMMARY_SINK] for s in table.snapshots()] == ["other", "lake"]
    assert table.current_snapshot().summary[iceberg.SUMMARY_ATTEMPT] == "2"
    assert _rows(config) == [("ours", 1), ("theirs", 2)]

    # A zombie committer of the same epoch: its commit conflicts, and the retry finds the marker.
    again = _stage(config, 2, "s0-t0", [{"user": "twice?", "n": 3}])
    interleaved.clear()

    def same_epoch_first(self: Any, table: Any, *args: Any) -> None:
        if not interleaved:
            interleaved.append("zombie")
            monkeypatch.setattr(iceberg.IcebergCommitter, "_one_commit", original)
            iceberg.IcebergCommitter(config).commit([again])
        original(self, table, *args)

    monkeypatch.setattr(iceberg.IcebergCommitter, "_one_commit", same_epoch_first)
    committer.commit([again])
    assert [r for r in _rows(config) if r[0] == "twice?"] == [("twice?", 3)]
    assert len(_table(config).snapshots()) == 3


def test_arrow_batches_stage_what_their_rows_would(config: dict[str, Any]) -> None:
    import pyarrow as pa

    from onceflow.sinks.base import supports_batches
    from onceflow.sinks.errors import RowError

    iceberg.plan_checks(_spec(config), [config], 1)
    writer = iceberg.IcebergWriter(config)
    assert supports_batches(writer)
    writer.begin(TaskContext(PIPELINE, 1, 0, "s0-t0", "0", "lake"))
    writer.write_batch(pa.record_batch({"n": pa.array([1, 2], pa.int32()), "user": ["x", "y"]}))
    writer.write([{"user": "z", "n": 3}])
    writer.write_batch(pa.record_batch({"user": ["no n"]}))  # a column the rows lack is null
    with pytest.raises(RowError, match=r"columns \['extra'\] are not in the table"):
        writer.write_batch(pa.record_batch({"user": ["u"], "n": [1], "extra": [True]}))
    committable = writer.pre_commit()
    assert committable.record_count == 4
    iceberg.IcebergCommitter(config).commit([committable])
    assert sorted(_table(config).scan().to_arrow().to_pylist(), key=lambda r: r["user"]) == [
        {"user": "no n", "n": None},
        {"user": "x", "n": 1},
        {"user": "y", "n": 2},
        {"user": "z", "n": 3},
    ]


def test_avro_timestamps_dates_and_decimals_become_iceberg_columns(
    config: dict[str, Any], tmp_path: Path
) -> None:
    import json
    from decimal import Decimal

    import pyarrow as pa

    from onceflow.pipeline import AvroFormat

    def avro_spec(extra: dict[str, Any]) -> tuple[Pipeline, dict[str, Any]]:
        fields = [
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
            {"name": "day", "type": {"type": "int", "logicalType": "date"}},
            extra,
        ]
        path = tmp_path / f"{extra['name']}.avsc"
        path.write_text(json.dumps({"type": "record", "name": "R", "fields": fields}))
        sink = {k: v for k, v in config.items() if k not in ("name", "columns")}
        sink["table"] = f"web.{extra['name']}"
        spec = Pipeline(
            PIPELINE,
            KafkaSource(("t",)),
            AvroFormat(schema_file=str(path)),
            (SinkSpec("lake", "iceberg", sink),),
        )
        return spec, {**sink, "name": "lake"}

    spec, sink = avro_spec({"name": "n", "type": "long"})
    iceberg.plan_checks(spec, [sink], 1)
    types = {f.name: str(f.field_type) for f in _table(sink).schema().fields}
    assert (types["at"], types["day"], types["n"]) == ("timestamptz", "date", "long")
    price = {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}
    spec, sink = avro_spec({"name": "amount", "type": price})
    iceberg.plan_checks(spec, [sink], 1)
    assert str(_table(sink).schema().find_field("amount").field_type) == "decimal(12, 2)"
    # The decoded rows reach the writer as Arrow decimal128(12, 2) (Spark's decimal(12,2)), or as rows.
    writer = iceberg.IcebergWriter(sink)
    writer.begin(TaskContext(PIPELINE, 1, 0, "s0-t0", "0", "lake"))
    amounts = pa.array([Decimal("-9999999999.99"), Decimal("0.01")], pa.decimal128(12, 2))
    writer.write_batch(pa.record_batch({"amount": amounts}))
    writer.write([{"amount": Decimal("12.5")}])
    iceberg.IcebergCommitter(sink).commit([writer.pre_commit()])
    written = [r["amount"] for r in _table(sink).scan().to_arrow().to_pylist()]
    assert sorted(written) == [Decimal("-9999999999.99"), Decimal("0.01"), Decimal("12.50")]
    # Declared the same way; a precision Iceberg cannot hold is one line.
    declared = {**config, "table": "web.declared", "columns": {"user": "string", "n": "decimal(38, 0)"}}
    iceberg.plan_checks(_spec(declared), [declared], 1)
    assert str(_table(declared).schema().find_field("n").field_type) == "decimal(38, 0)"
    too_wide = {**declared, "table": "web.too_wide", "columns": {"n": "decimal(39,2)"}}
    with pytest.raises(ConfigError, match=r"column type 'decimal\(39,2\)': precision 1..38"):
        iceberg.plan_checks(_spec(too_wide), [too_wide], 1)


def test_an_avro_subjects_table_takes_the_first_rows_columns(config: dict[str, Any]) -> None:
    """A subject's schema is pinned when a slice opens, after plan: the plan leaves the table to the rows."""
    from onceflow.pipeline import AvroFormat

    sink = {k: v for k, v in config.items() if k not in ("name", "columns")}
    sink["table"] = "web.from_subject"
    spec = Pipeline(
        PIPELINE, KafkaSource(("t",)), AvroFormat(subject="t-value"), (SinkSpec("lake", "iceberg", sink),)
    )
    iceberg.plan_checks(spec, [{**sink, "name": "lake"}], 1)
    assert _table({**sink, "name": "lake"}) is None

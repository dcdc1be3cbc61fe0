"""`python -m bench.delta_writers`: the two ways of writing Delta, on the same rows, side by side.

1. **The sink's path** (`onceflow.sinks.delta`, delta-rs): 4 writers, one per input partition as the
   engine's write tasks, stage the epoch's rows as Parquet files, then the committer adds them in one
   Delta commit with a ``txn`` action (epoch). Measured with the rows as Arrow batches of 10,000
   (``write_batch``, what a Spark write task hands over) and as rows (``write``), in this process, without
   Spark: staging and commit timed apart.
2. **delta-spark on the warm Spark Connect runtime**: a DataFrame of the same rows, made here from an
   Arrow table (``createDataFrame``: the rows travel to the server with the plan), written with
   ``df.write.format("delta").mode("append")`` and Delta's idempotent-write options ``txnAppId`` /
   ``txnVersion`` (the round). The same write is then repeated with the same ``txnVersion``: Delta must
   skip it (no new version, no new rows). What the Connect path costs is measured apart: the same
   upload into Spark's ``noop`` sink, and the same rows computed on the server (``spark.range``) written
   to Delta without any upload.

Rows: the benchmark's projected records (`bench.dataset`: ``id``, ``amount``, ``customer``, as the
benchmark pipelines' sinks receive them). Each way appends to a table of its own, one epoch (txn version)
per round; the ways alternate in order from round to round. Writes ``--out`` (bench/delta_writers.json)
and prints a markdown table.

    python -m bench.delta_writers [--rows 1000000] [--rounds 3] [--out bench/delta_writers.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.dataset import PARTITIONS, PROJECTED, amount_of
from onceflow import redact
from onceflow.config import Settings
from onceflow.sinks.base import Committable, TaskContext
from onceflow.sinks.delta import DeltaCommitter, DeltaWriter

BATCH_ROWS = 10_000  # spark.sql.execution.arrow.maxRecordsPerBatch's default: a write task's batches
ROW_CHUNK = 5_000  # rows handed to `write` at a time, as `bench.commit_cost` does
COLUMNS = {"id": "long", "amount": "double", "customer": "string"}
SINK_WAYS = ("sink, Arrow batches", "sink, rows")
SPARK_WAY = "delta-spark via Connect"


def task_tables(rows: int) -> list[Any]:
    """The records 0..rows-1 split over PARTITIONS tasks as `bench.commit_cost` splits them (task k: ids
    k, k+4, ...), each an Arrow table."""
    import pyarrow as pa

    per_task = rows // PARTITIONS
    out = []
    for task in range(PARTITIONS):
        ids = range(task, task + per_task * PARTITIONS, PARTITIONS)
        out.append(
            pa.table(
                {
                    "id": pa.array(ids, pa.int64()),
                    "amount": pa.array([amount_of(i) for i in ids], pa.float64()),
                    "customer": pa.array([f"c{i % 5000:05d}" for i in ids], pa.string()),
                }
            )
        )
    assert tuple(out[0].column_names) == PROJECTED
    return out


def sink_path(
    path: str, pipeline: str, epoch: int, tables: list[Any], as_rows: bool
) -> tuple[float, float, int]:
    """(seconds for 4 writers to stage and pre-commit, seconds for the commit, files added)."""
    config = {"path": path, "columns": COLUMNS, "name": "out"}
    started = time.perf_counter()
    committables: list[Committable] = []
    for task, table in enumerate(tables):
        writer = DeltaWriter(config)
        writer.begin(TaskContext(pipeline, epoch, 0, f"s0-t{task}", "a0", "out"))
        if as_rows:
            rows = table.to_pylist()
            for start in range(0, len(rows), ROW_CHUNK):
                writer.write(rows[start : start + ROW_CHUNK])
        else:
            for batch in table.to_batches(max_chunksize=BATCH_ROWS):
                writer.write_batch(batch)
        committables.append(writer.pre_commit())
    staged = time.perf_counter()
    DeltaCommitter(config).commit(committables)
    committed = time.perf_counter()
    files = sum(len(c.handle["files"]) for c in committables)
    return staged - started, committed - staged, files


def _server_rows(spark: Any, rows: int) -> Any:
    """The same records computed by the server (no upload): ids, amounts and customers as `task_tables`."""
    from pyspark.sql import functions as F

    ids = F.col("id")
    return spark.range(0, rows, 1, PARTITIONS).select(
        ids,
        ((ids * 7919) % 10_000 / 100).cast("double").alias("amount"),
        F.format_string("c%05d", ids % 5000).alias("customer"),
    )


def _delta_write(frame: Any, path: str, app: str, version: int) -> float:
    started = time.perf_counter()
    (
        frame.write.format("delta")
        .mode("append")
        .option("txnAppId", app)
        .option("txnVersion", version)
        .save(path)
    )
    return time.perf_counter() - started


def _table_state(path: str, app: str) -> tuple[int, int, int | None]:
    """(version, rows, the app's txn version) as delta-rs reads the table's log."""
    from deltalake import DeltaTable

    table = DeltaTable(path)
    rows = sum(int(n) for n in table.get_add_actions(flatten=True).column("num_records").to_pylist())
    return table.version(), rows, table.transaction_version(app)


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).with_name("delta_writers.json")))
    parser.add_argument("--report", help="bench/report.md: write the figures into its Delta writers section")
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    if settings.spark_remote is None:
        raise SystemExit("set ONCEFLOW_SPARK_REMOTE: delta-spark is measured on the Spark Connect runtime")
    import pyarrow as pa
    from pyspark.sql import SparkSession

    rows = args.rows - args.rows % PARTITIONS
    tables = task_tables(rows)
    whole = pa.concat_tables(tables)
    pipeline = f"bench-delta-{uuid.uuid4().hex[:6]}"
    app = f"{pipeline}:spark"
    sink_runs: dict[str, dict[str, list[float]]] = {
        way: {"stage_s": [], "commit_s": [], "total_s": []} for way in SINK_WAYS
    }
    spark_runs: dict[str, list[float]] = {
        "total_s": [],  # createDataFrame (the upload) and the Delta write
        "upload_noop_s": [],  # createDataFrame into the noop sink: the Connect path alone
        "repeat_s": [],  # the same write again, same txnVersion: skipped
        "server_rows_s": [],  # the rows computed by the server, written to Delta: no upload
    }
    checks: list[str] = []
    files: dict[str, int] = {}
    spark = SparkSession.builder.remote(settings.spark_remote).create()
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-delta-") as tmp:
        paths = {way: f"{tmp}/{n}" for n, way in enumerate((*SINK_WAYS, SPARK_WAY, "server rows"))}

        def sink_round(epoch: int) -> None:
            for way in SINK_WAYS:
                stage, commit, added = sink_path(paths[way], pipeline, epoch, tables, "rows" in way)
                runs = sink_runs[way]
                runs["stage_s"].append(round(stage, 3))
                runs["commit_s"].append(round(commit, 3))
                runs["total_s"].append(round(stage + commit, 3))
                files[way] = added
                _, held, txn = _table_state(paths[way], f"{pipeline}:out")
                assert (held, txn) == (epoch * rows, epoch), (way, held, txn)
                print(f"round {epoch}: {way}: stage {stage:.2f} s, commit {commit:.2f} s", flush=True)

        def spark_round(epoch: int) -> None:
            path = paths[SPARK_WAY]
            started = time.perf_counter()
            spark.createDataFrame(whole).write.format("noop").mode("overwrite").save()
            spark_runs["upload_noop_s"].append(round(time.perf_counter() - started, 3))
            started = time.perf_counter()
            _delta_write(spark.createDataFrame(whole), path, app, epoch)
            spark_runs["total_s"].append(round(time.perf_counter() - started, 3))
            version, held, txn = _table_state(path, app)
            assert (held, txn) == (epoch * rows, epoch), (SPARK_WAY, held, txn)
            started = time.perf_counter()
            _delta_write(spark.createDataFrame(whole), path, app, epoch)
            spark_runs["repeat_s"].append(round(time.perf_counter() - started, 3))
            again = _table_state(path, app)
            skipped = again == (version, held, txn)
            checks.append(
                f"round {epoch}: repeated txnVersion {epoch}: {'skipped' if skipped else 'WRITTEN'}"
            )
            assert skipped, (SPARK_WAY, again, (version, held, txn))
            server = paths["server rows"]
            spark_runs["server_rows_s"].append(
                round(_delta_write(_server_rows(spark, rows), server, app, epoch), 3)
            )
            assert _table_state(server, app)[1:] == (epoch * rows, epoch)
            print(
                f"round {epoch}: {SPARK_WAY}: {spark_runs['total_s'][-1]:.2f} s (upload to noop "
                f"{spark_runs['upload_noop_s'][-1]:.2f} s, repeat {spark_runs['repeat_s'][-1]:.2f} s, "
                f"server rows {spark_runs['server_rows_s'][-1]:.2f} s)",
                flush=True,
            )

        try:
            warm_up(spark, tmp)
            for epoch in range(1, args.rounds + 1):
                order: list[Callable[[int], None]] = [sink_round, spark_round]
                for step in order if epoch % 2 else reversed(order):
                    step(epoch)
            from deltalake import DeltaTable

            files[SPARK_WAY] = len(DeltaTable(paths[SPARK_WAY]).file_uris()) // args.rounds
        finally:
            spark.stop()
    result = {
        "what": "one epoch of the projected records (id, amount, customer) appended to a Delta table",
        "rows": rows,
        "rounds": args.rounds,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "spark_remote": redact.url(settings.spark_remote),
        "sink": {
            way: {
                **runs,
                "median_s": _median(runs["total_s"]),
                "rows_per_s": round(rows / statistics.median(runs["total_s"])),
                "files_per_epoch": files[way],
            }
            for way, runs in sink_runs.items()
        },
        "delta_spark": {
            **spark_runs,
            "median_s": _median(spark_runs["total_s"]),
            "rows_per_s": round(rows / statistics.median(spark_runs["total_s"])),
            "upload_share": round(
                statistics.median(spark_runs["upload_noop_s"]) / statistics.median(spark_runs["total_s"]), 2
            ),
            "files_per_epoch": files[SPARK_WAY],
            "repeated_writes": checks,
        },
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    if args.report:
        from bench.report import write_section

        section = "\n".join(
            [
                BEGIN,
                "### Writing Delta: the sink's path or delta-spark",
                "",
                "Measured by `python -m bench.delta_writers --report bench/report.md` on the stack's Spark "
                "Connect runtime.",
                "",
                markdown(result),
                END,
            ]
        )
        write_section(Path(args.report), section, BEGIN, END)
    return 0


BEGIN, END = "<!-- delta-writers -->", "<!-- /delta-writers -->"


def warm_up(spark: Any, tmp: str) -> None:
    """One small write each way, not counted: imports, the session's first plans, the Delta classes."""
    import pyarrow as pa

    small = task_tables(1000)
    sink_path(f"{tmp}/warm-sink", "bench-delta-warm", 1, small, as_rows=False)
    _delta_write(spark.createDataFrame(pa.concat_tables(small)), f"{tmp}/warm-spark", "warm", 1)


def markdown(result: dict[str, Any]) -> str:
    """The figures as a small markdown table, with the Connect path's costs under it."""
    rows = result["rows"]
    lines = [
        f"{rows:,} rows (id, amount, customer), one epoch per round, {result['rounds']} rounds alternating; "
        "medians, each round's seconds in brackets.",
        "",
        "| way | wall s | rows/s | stage s | commit s | files per epoch |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for way, runs in result["sink"].items():
        lines.append(
            f"| {way} (4 writers + 1 commit) | {runs['median_s']:.2f} "
            f"({', '.join(map(str, runs['total_s']))}) | "
            f"{runs['rows_per_s']:,} | {_median(runs['stage_s']):.2f} | {_median(runs['commit_s']):.2f} | "
            f"{runs['files_per_epoch']} |"
        )
    spark = result["delta_spark"]
    arrow = result["sink"][SINK_WAYS[0]]
    lines += [
        f"| {SPARK_WAY} (Arrow upload + write) | {spark['median_s']:.2f} "
        f"({', '.join(map(str, spark['total_s']))}) | {spark['rows_per_s']:,} | – | – | "
        f"{spark['files_per_epoch']} |",
        "",
        f"delta-spark, the Connect path: the upload alone (same createDataFrame into the noop sink) "
        f"{_median(spark['upload_noop_s']):.2f} s, {spark['upload_share']:.0%} of its write; the same rows "
        f"computed on the server and written to Delta {_median(spark['server_rows_s']):.2f} s; the write "
        f"repeated with the same txnVersion {_median(spark['repeat_s']):.2f} s, skipped every round "
        f"({len(spark['repeated_writes'])} of {result['rounds']}).",
        "",
        f"The sink's Arrow path took {spark['median_s'] / arrow['median_s']:.0f}x less time than delta-spark "
        f"through Connect, {_median(spark['server_rows_s']) / arrow['median_s']:.0f}x less than delta-spark "
        "writing rows the server already held.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())

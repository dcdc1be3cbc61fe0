"""One Spark write task's work, fed rows (the former path) and Arrow batches (today's), side by side.

A write task receives the transform's output as Arrow record batches (``mapInArrow``, 10,000 rows each by
Spark's default). The row path turns them into dicts (`batch_rows`) and writes rows; the Arrow path
hands the batches to the writer. Both run the whole task here, begin to pre-commit (PostgreSQL: COPY and
PREPARE TRANSACTION; files: Parquet staging, fsync and manifest), on 10^6 rows of the benchmark's
projected shape (id, amount, customer), then roll their staging back. Runs alternate between the paths
and the median of each is kept.

    python -m bench.writer_paths [--rows 1000000] [--repeats 3] [--out bench/writer_paths.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.dataset import PROJECTED, SCHEMA, amount_of
from bench.pipelines import PG_COLUMNS
from onceflow.config import Settings
from onceflow.executor.arrow_rows import batch_rows
from onceflow.executor.slices import SliceRef
from onceflow.executor.writing import TaskReport, write_task, write_task_batches
from onceflow.offsets import OffsetRange
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec
from onceflow.sinks.registry import sink_kind

SPARK_BATCH_ROWS = 10_000  # spark.sql.execution.arrow.maxRecordsPerBatch's default


def batches(rows: int) -> list[Any]:
    """The projected benchmark records 0..rows-1 as Arrow batches, as a write task receives them."""
    import pyarrow as pa

    out = []
    for start in range(0, rows, SPARK_BATCH_ROWS):
        ids = range(start, min(rows, start + SPARK_BATCH_ROWS))
        out.append(
            pa.record_batch(
                {
                    "id": pa.array(ids, pa.int64()),
                    "amount": pa.array([amount_of(i) for i in ids], pa.float64()),
                    "customer": pa.array([f"c{i % 5000:05d}" for i in ids], pa.string()),
                }
            )
        )
    assert tuple(out[0].schema.names) == PROJECTED
    return out


def run_once(ref: SliceRef, sink: SinkSpec, path: str, data: list[Any]) -> float:
    """Seconds for one write task on ``path``; its staging is rolled back afterwards."""
    attempt = f"{path}-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    report: TaskReport
    if path == "rows":
        report = write_task(ref, sink, "s0-t0", attempt, batch_rows(data))
    else:
        report = write_task_batches(ref, sink, "s0-t0", attempt, data)
    elapsed = time.perf_counter() - started
    kind = sink_kind(sink.kind)
    kind.build_committer(kind.config_for(sink, ref.settings)).abort([report.to_committable()])
    assert report.records == sum(b.num_rows for b in data)
    return elapsed


def measure(rows: int, repeats: int, settings: Settings, workdir: Path) -> dict[str, Any]:
    data = batches(rows)
    table = f"bench_writer_paths_{uuid.uuid4().hex[:8]}"
    sinks = {
        "files": SinkSpec("out", "files", {"root": str(workdir / "files"), "table": table}),
        "postgres_2pc": SinkSpec("out", "postgres_2pc", {"table": table, "columns": PG_COLUMNS}),
    }
    results: dict[str, Any] = {}
    try:
        for name, sink in sinks.items():
            spec = Pipeline(
                f"writer-paths-{uuid.uuid4().hex[:6]}", KafkaSource(("in",)), JsonFormat(SCHEMA), (sink,)
            )
            ref = SliceRef(
                spec, 1, 0, (OffsetRange("in", 0, 0, rows),), settings.kafka_bootstrap, settings=settings
            )
            run_once(ref, sink, "batches", data[:1])  # warm-up: imports, table creation
            times: dict[str, list[float]] = {"rows": [], "batches": []}
            for _ in range(repeats):
                for path in ("rows", "batches"):
                    times[path].append(run_once(ref, sink, path, data))
            row_s, arrow_s = statistics.median(times["rows"]), statistics.median(times["batches"])
            results[name] = {
                "row_path_s": round(row_s, 3),
                "arrow_path_s": round(arrow_s, 3),
                "row_path_rows_per_s": round(rows / row_s),
                "arrow_path_rows_per_s": round(rows / arrow_s),
                "speedup": round(row_s / arrow_s, 2),
                "runs_s": {p: [round(t, 3) for t in ts] for p, ts in times.items()},
            }
            print(f"{name}: rows {row_s:.2f} s, batches {arrow_s:.2f} s ({row_s / arrow_s:.1f}x)", flush=True)
    finally:
        _drop_table(settings, table)
    return results


def _drop_table(settings: Settings, table: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("writer_paths.json"))
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    with tempfile.TemporaryDirectory(prefix="onceflow-writer-paths-") as workdir:
        results = measure(args.rows, args.repeats, settings, Path(workdir))
    report = {
        "what": "one write task, begin to pre-commit, of the projected rows (id, amount, customer)",
        "rows": args.rows,
        "batch_rows": SPARK_BATCH_ROWS,
        "repeats": args.repeats,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "sinks": results,
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Count what a bench pipeline made visible in its sink, and remove its output afterwards."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from onceflow.config import Settings
from onceflow.pipeline import Pipeline


def visible_rows(spec: Pipeline, settings: Settings) -> int:
    """Rows a reader of the sink sees now: committed Parquet files, the PostgreSQL table's rows, or the
    rows of the data files an Iceberg snapshot or the Delta log holds."""
    sink = spec.sinks[0]
    if sink.kind == "files":
        import pyarrow.parquet as pq

        from onceflow.names import check_name
        from onceflow.sinks.files import committed_files

        # The row counts in the committed files' footers: reading the tables themselves left their
        # memory (a 10^7-record run's, about 300 MB) with this process, which the next pipelines'
        # epochs sample as the slice's driver.
        table_dir = Path(sink.config["root"]) / check_name("table", sink.config["table"])
        return sum(pq.ParquetFile(f).metadata.num_rows for f in committed_files(table_dir))
    if sink.kind in ("postgres_2pc", "plain"):
        import psycopg
        from psycopg import sql

        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            row = conn.execute(
                sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(sink.config["table"]))
            ).fetchone()
        return int(row[0]) if row else 0
    if sink.kind == "iceberg":
        table = _iceberg_table(sink.config)
        return 0 if table is None else sum(task.file.record_count for task in table.scan().plan_files())
    if sink.kind == "delta":
        from deltalake import DeltaTable

        # The files the log holds now, by the row counts in their footers (as for the files sink).
        return int(DeltaTable(sink.config["path"]).to_pyarrow_dataset().count_rows())
    raise ValueError(f"no row count for sink kind {sink.kind!r}")


def drop_output(spec: Pipeline, settings: Settings) -> None:
    sink = spec.sinks[0]
    if sink.kind == "files":
        shutil.rmtree(Path(sink.config["root"]) / sink.config["table"], ignore_errors=True)
    elif sink.kind in ("postgres_2pc", "plain"):
        import psycopg
        from psycopg import sql

        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(sink.config["table"])))
            if sink.kind == "postgres_2pc":
                exists = conn.execute("SELECT to_regclass('onceflow_markers')").fetchone()
                if exists and exists[0] is not None:
                    conn.execute("DELETE FROM onceflow_markers WHERE pipeline = %s", [spec.name])
    elif sink.kind == "iceberg":
        table = _iceberg_table(sink.config)
        if table is not None:
            _iceberg_catalog(sink.config).drop_table(sink.config["table"])
            shutil.rmtree(table.location().removeprefix("file://"), ignore_errors=True)
    elif sink.kind == "delta":
        shutil.rmtree(sink.config["path"], ignore_errors=True)


def _iceberg_catalog(config: Mapping[str, Any]) -> Any:
    from onceflow.sinks.iceberg import table as tables

    return tables.catalog(config["catalog"], config["catalog_properties"])


def _iceberg_table(config: Mapping[str, Any]) -> Any | None:
    """The Iceberg sink's table, or None when it was never created."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return _iceberg_catalog(config).load_table(config["table"])
    except NoSuchTableError:
        return None

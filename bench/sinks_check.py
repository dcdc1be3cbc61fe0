"""Count what a bench pipeline made visible in its sink, and remove its output afterwards.

Output in a bucket (an ``s3://`` files root or Iceberg warehouse) is read and deleted through the
object store's API with the stack's settings (``Settings.s3``), as a reader elsewhere would see it.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from onceflow.config import Settings
from onceflow.pipeline import Pipeline
from onceflow.storage.s3 import S3Settings, is_s3, join


def visible_rows(spec: Pipeline, settings: Settings) -> int:
    """Rows a reader of the sink sees now: committed Parquet files, the PostgreSQL table's rows, or the
    rows of the data files an Iceberg snapshot or the Delta log holds."""
    sink = spec.sinks[0]
    if sink.kind == "files" and is_s3(sink.config["root"]):
        return _files_rows_in_bucket(sink.config, _s3(settings))
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
        table = _iceberg_table(sink.config, settings)
        if table is None:
            return 0
        files = [task.file for task in table.scan().plan_files()]
        if is_s3(sink.config["catalog_properties"].get("warehouse")):
            elsewhere = [f.file_path for f in files if not is_s3(f.file_path)]
            if elsewhere or not is_s3(table.location()):  # a bucket's run must have measured the bucket
                raise RuntimeError(f"{sink.config['table']}: a warehouse in a bucket, files at {elsewhere}")
        return sum(f.record_count for f in files)
    if sink.kind == "delta":
        from deltalake import DeltaTable

        # The files the log holds now, by the row counts in their footers (as for the files sink).
        return int(DeltaTable(sink.config["path"]).to_pyarrow_dataset().count_rows())
    raise ValueError(f"no row count for sink kind {sink.kind!r}")


def _files_rows_in_bucket(config: Mapping[str, Any], s3: S3Settings) -> int:
    """The files sink's visible rows in a bucket: the live objects of its commit log (the sink's reader
    rule), by the row counts in their footers, read through the store."""
    import pyarrow.parquet as pq

    from onceflow.names import check_name
    from onceflow.sinks.files import committed_files

    filesystem = s3.filesystem()
    rows = 0
    for url in committed_files(join(config["root"], check_name("table", config["table"])), s3):
        with filesystem.open_input_file(url.removeprefix("s3://")) as file:
            rows += pq.ParquetFile(file).metadata.num_rows
    return rows


def _s3(settings: Settings) -> S3Settings:
    if settings.s3 is None:
        raise RuntimeError("output in a bucket, but no object store settings (AWS_ENDPOINT_URL, ...)")
    return settings.s3


def delete_location(location: str, settings: Settings) -> None:
    """Delete a folder (a path or ``file://`` URI) or every object under an ``s3://`` prefix.

    In a bucket, object by object, the deepest first, until a listing finds none: a batch delete of a
    prefix (pyarrow's ``delete_dir``) also names the folder objects (``a/``) it listed, which a store on
    a file system (the stack's gateway) refuses while their objects are still there, and leaves the
    parent's folder object behind."""
    if not is_s3(location):
        shutil.rmtree(location.removeprefix("file://"), ignore_errors=True)
        return
    from onceflow.storage.s3 import split

    client = _s3(settings).client()
    bucket, key = split(location)
    prefix = f"{key}/" if key else ""
    for _ in range(5):
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
        if not keys:
            return
        for name in sorted(keys, key=lambda k: (-k.rstrip("/").count("/"), k.endswith("/"), k)):
            client.delete_object(Bucket=bucket, Key=name)
    raise RuntimeError(f"{location}: objects left after deleting them five times")


def drop_output(spec: Pipeline, settings: Settings) -> None:
    sink = spec.sinks[0]
    if sink.kind == "files" and is_s3(sink.config["root"]):
        # The table and what the pipeline staged beside it (under the root's staging folder).
        delete_location(join(sink.config["root"], sink.config["table"]), settings)
        delete_location(join(sink.config["root"], "_staging", spec.name), settings)
    elif sink.kind == "files":
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
        table = _iceberg_table(sink.config, settings)
        if table is not None:
            _iceberg_catalog(sink.config, settings).drop_table(sink.config["table"])
            delete_location(table.location(), settings)
    elif sink.kind == "delta":
        shutil.rmtree(sink.config["path"], ignore_errors=True)


def _iceberg_catalog(config: Mapping[str, Any], settings: Settings) -> Any:
    """The sink's catalog; with a warehouse in a bucket, its FileIO gets the store's settings."""
    from onceflow.sinks.iceberg import table as tables

    properties = dict(config["catalog_properties"])
    if is_s3(properties.get("warehouse")):  # as the sink opens it: its own properties win
        properties = {**_s3(settings).iceberg_properties(), **properties}
    return tables.catalog(config["catalog"], properties)


def _iceberg_table(config: Mapping[str, Any], settings: Settings) -> Any | None:
    """The Iceberg sink's table, or None when it was never created."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return _iceberg_catalog(config, settings).load_table(config["table"])
    except NoSuchTableError:
        return None

"""Count what a bench pipeline made visible in its sink, and remove its output afterwards."""

from __future__ import annotations

import shutil
from pathlib import Path

from onceflow.config import Settings
from onceflow.pipeline import Pipeline


def visible_rows(spec: Pipeline, settings: Settings) -> int:
    """Rows a reader of the sink sees now: committed Parquet files, or the PostgreSQL table's rows."""
    sink = spec.sinks[0]
    if sink.kind == "files":
        from onceflow.sinks.files import read_committed_table

        return int(read_committed_table(sink.config["root"], sink.config["table"]).num_rows)
    if sink.kind in ("postgres_2pc", "plain"):
        import psycopg
        from psycopg import sql

        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            row = conn.execute(
                sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(sink.config["table"]))
            ).fetchone()
        return int(row[0]) if row else 0
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

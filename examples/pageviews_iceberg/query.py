"""Views per minute and page, summed over the epochs that contributed, as a user reads them.

    python -m examples.pageviews_iceberg.query           # with pyiceberg
    python -m examples.pageviews_iceberg.query --spark   # with Spark SQL (Iceberg's Spark runtime)

The Spark SQL query, which any Spark with the Iceberg runtime and this catalog runs as it is:

    SELECT minute, page, sum(views) AS views FROM onceflow.pageviews.per_minute
    GROUP BY minute, page ORDER BY minute, page
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path
from typing import Any

from examples.pageviews_iceberg.pipeline import PAGEVIEWS_ICEBERG, PER_MINUTE
from onceflow.config import Settings
from onceflow.sinks import iceberg
from onceflow.sinks.iceberg.spark import spark_conf

REPO = Path(__file__).resolve().parents[2]


def _config() -> iceberg.IcebergConfig:
    sink = next(s for s in PAGEVIEWS_ICEBERG.sinks if s.name == "per_minute")
    return iceberg.IcebergConfig.from_mapping(iceberg.SINK_KIND.config_for(sink, Settings.from_env()))


def with_pyiceberg() -> list[tuple[Any, str, int]]:
    config = _config()
    table = iceberg.tables.load(config.open_catalog(), config.table)
    if table is None:
        return []
    totals: dict[tuple[Any, str], int] = {}
    for row in table.scan().to_arrow().to_pylist():
        key = (row["minute"], row["page"])
        totals[key] = totals.get(key, 0) + int(row["views"])
    return sorted((minute, page, views) for (minute, page), views in totals.items())


def with_spark_sql() -> list[tuple[Any, str, int]]:
    from pyspark.sql import SparkSession

    config = _config()
    jars = subprocess.run(
        [str(REPO / "infra/iceberg.sh"), "path"], check=True, capture_output=True, text=True
    ).stdout.strip()
    builder = SparkSession.builder.master("local[1]").appName("pageviews-query")
    for key, value in spark_conf(config.catalog, dict(config.catalog_properties), jars).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        rows = spark.sql(
            f"SELECT minute, page, sum(views) AS views FROM {config.catalog}.{PER_MINUTE} "
            "GROUP BY minute, page ORDER BY minute, page"
        ).collect()
        return [(r["minute"], r["page"], int(r["views"])) for r in rows]
    finally:
        spark.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.pageviews_iceberg.query", description=__doc__)
    parser.add_argument("--spark", action="store_true", help="read with Spark SQL instead of pyiceberg")
    args = parser.parse_args(argv)
    for minute, page, views in with_spark_sql() if args.spark else with_pyiceberg():
        print(f"{minute}  {page}  {views}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Run Spark SQL queries against an Iceberg sink's catalog in a local-mode Spark; print rows as JSON lines.

    python -m tests.integration.iceberg_spark_sql CATALOG_PROPERTIES_JSON "SELECT ..." ["SELECT ..."]

Spark reads the tables of pyiceberg's SQL catalog through Iceberg's own JdbcCatalog
(`onceflow.sinks.iceberg.spark`), with the Iceberg Spark runtime from Maven Central
(`infra/iceberg.sh path`), as catalog ``onceflow``. Its own process, so that no Spark Connect setting of
the caller applies. Each query's rows are printed after a line ``-- query N``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from onceflow.sinks.iceberg.spark import spark_conf

REPO = Path(__file__).resolve().parents[2]


def main(argv: list[str]) -> int:
    properties, *queries = argv
    jars = subprocess.run(
        [str(REPO / "infra/iceberg.sh"), "path"], check=True, capture_output=True, text=True
    ).stdout.strip()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[1]").appName("onceflow-iceberg-read")
    for key, value in spark_conf("onceflow", json.loads(properties), jars).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        for number, query in enumerate(queries):
            print(f"-- query {number}")
            for row in spark.sql(query).collect():
                print(json.dumps(row.asDict(), default=str))
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

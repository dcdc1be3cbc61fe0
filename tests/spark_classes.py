"""A spark-submit job whose JVM classes become the suite's class-data-sharing archive (tests/conftest.py).

It touches what a slice job's driver loads on every epoch: a SparkSession, a DataFrame through Arrow into
a Python worker and back, and a result collected on the driver.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def _same(batches: Iterator[Any]) -> Iterator[Any]:
    yield from batches


def main() -> None:
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("onceflow-tests-class-archive").getOrCreate()
    frame = spark.range(100, numPartitions=2).selectExpr("id", "cast(id as string) as text")
    assert frame.mapInArrow(_same, frame.schema).count() == 100
    spark.stop()


if __name__ == "__main__":
    main()

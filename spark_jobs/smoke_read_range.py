"""spark-submit entry point of the smoke DAG: executors read one Kafka offset range with confluent-kafka.

The range is cut into read tasks; each Spark task reads its sub-range with onceflow's exact range reader
(read_committed, stop on position) and the driver writes what was read as JSON to --output.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator

from pyspark.sql import SparkSession

from onceflow.config import Settings
from onceflow.offsets import OffsetRange
from onceflow.sources.kafka_range import read_range


def _read(bootstrap: str, ranges: Iterator[OffsetRange]) -> Iterator[tuple[int, str]]:
    for offset_range in ranges:
        for record in read_range(bootstrap, offset_range):
            yield record.offset, (record.value or b"").decode("utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partition", type=int, required=True)
    parser.add_argument("--from-offset", type=int, required=True)
    parser.add_argument("--until-offset", type=int, required=True)
    parser.add_argument("--read-tasks", type=int, default=2)
    parser.add_argument("--output", required=True)
    args = parser.parse_args()

    whole = OffsetRange(args.topic, args.partition, args.from_offset, args.until_offset)
    span = max(1, -(-whole.span // args.read_tasks))
    pieces = whole.split(span)
    bootstrap = Settings.from_env().kafka_bootstrap

    spark = SparkSession.builder.appName("onceflow-smoke").getOrCreate()
    try:
        rdd = spark.sparkContext.parallelize(pieces, len(pieces))
        records = rdd.mapPartitions(lambda part: _read(bootstrap, part)).collect()
        with open(args.output, "w", encoding="utf-8") as out:
            json.dump({"read_tasks": rdd.getNumPartitions(), "records": records}, out)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()

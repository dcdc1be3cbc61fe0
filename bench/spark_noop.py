"""A spark-submit entry point that only starts and stops a SparkSession: the job's fixed start-up cost.

It imports the slice job's module first, as the real entry point does, so that the Python import time is
counted too.
"""

from __future__ import annotations

import onceflow.engine.slice_job  # noqa: F401  (imported for its start-up cost, like the real job)


def main() -> None:
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.appName("onceflow-bench-noop")
        .config("spark.sql.adaptive.coalescePartitions.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.parallelize([0], 1).count()  # one task, so that an executor Python worker starts
    spark.stop()


if __name__ == "__main__":
    main()

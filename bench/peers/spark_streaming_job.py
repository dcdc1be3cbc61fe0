"""The Spark Structured Streaming peer (a spark-submit entry point): the benchmark's decode, filter and
projection with the Kafka source, ``trigger(availableNow=True)`` and ``foreachBatch`` writing Parquet.
With ``--avro-schema``, the values are Avro in the schema registry wire format instead of JSON: the
5-byte header (magic byte, schema id) is cut off and the body read by spark-avro's ``from_avro`` with that
schema, which is how a Spark job reads such a topic without a registry client. With ``--nested``, the
values are the nested data set's orders, read with ``from_json`` and a nested ``StructType`` (or, with
``--avro-schema`` too, with ``from_avro`` and that nested schema), and the items are written with the
three columns. With ``--delta``, the rows go to Structured Streaming's own Delta sink instead
(``writeStream.format("delta")`` into the table at ``--out``; the session needs delta-spark's jars and
SQL extension): each micro-batch is one Delta commit with a ``txn`` action of the query's id and batch
id, so a replayed batch adds nothing, Delta's exactly-once for streaming writes. With ``--file-sink``, they
go to Structured Streaming's own file sink (``writeStream.format("parquet")`` at ``--out``): each
micro-batch's files are committed by an entry of the ``_spark_metadata`` log, which readers go by, so a
replayed batch adds nothing either. An ``s3a://`` ``--out`` is written through Hadoop's S3A connector
(its jars on the class path), configured from the AWS variables of the environment (`s3a_conf`): the
credentials never appear on a command line.

Without ``--delta``, each micro-batch overwrites ``out/batch=<id>``: a replayed batch id rewrites the
same folder, which is how foreachBatch output is made idempotent (Spark itself gives foreachBatch
at-least-once). The checkpoint's offset and commit logs give the replay. Prints one JSON line:
{"processing_s", "rows", "batches"}.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Mapping


def s3a_conf(env: Mapping[str, str]) -> dict[str, str]:
    """The Spark settings of the S3A connector for the object store the AWS variables name: a local S3
    server is spoken to by path (``http://host:port/bucket/key``), without TLS for an ``http://``
    endpoint; without credentials in the variables, S3A's own provider chain finds them."""
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    conf = {"fs.s3a.endpoint.region": env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"}
    if endpoint:
        conf["fs.s3a.endpoint"] = endpoint
        conf["fs.s3a.path.style.access"] = "true"
        conf["fs.s3a.connection.ssl.enabled"] = "false" if endpoint.startswith("http://") else "true"
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        conf["fs.s3a.access.key"] = env["AWS_ACCESS_KEY_ID"]
        conf["fs.s3a.secret.key"] = env["AWS_SECRET_ACCESS_KEY"]
        if env.get("AWS_SESSION_TOKEN"):
            conf["fs.s3a.session.token"] = env["AWS_SESSION_TOKEN"]
    return {f"spark.hadoop.{key}": value for key, value in conf.items()}


def main() -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, DoubleType, LongType, StringType, StructField, StructType

    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--max-offsets", type=int, required=True, help="records per micro-batch")
    parser.add_argument("--min-amount", type=float, required=True)
    parser.add_argument("--avro-schema", help="the writer's Avro schema (JSON text): values are Avro")
    parser.add_argument("--nested", action="store_true", help="the nested data set: orders with items")
    parser.add_argument("--delta", action="store_true", help="write a Delta table at --out")
    parser.add_argument("--file-sink", action="store_true", help="Spark's Parquet file sink at --out")
    args = parser.parse_args()

    builder = SparkSession.builder.appName("onceflow-bench-structured-streaming")
    if args.out.startswith("s3a://"):
        for key, value in s3a_conf(os.environ).items():
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    schema = StructType(
        [
            StructField("id", LongType()),
            StructField("amount", DoubleType()),
            StructField("customer", StringType()),
            StructField("country", StringType()),
            StructField("note", StringType()),
        ]
    )
    projected = ["id", "amount", "customer"]
    if args.nested:
        item = StructType(
            [
                StructField("sku", StringType()),
                StructField("qty", LongType()),
                StructField("price", DoubleType()),
            ]
        )
        context = StructType([StructField("ip", StringType()), StructField("agent", StringType())])
        schema = StructType(
            [
                *schema.fields[:4],
                StructField("items", ArrayType(item)),
                StructField("ctx", context),
                schema.fields[4],
            ]
        )
        projected.append("items")
    records = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", args.max_offsets)
        .option("kafka.isolation.level", "read_committed")
        .load()
    )
    if args.avro_schema:
        from pyspark.sql.avro.functions import from_avro

        # substring on binary is 1-based: the body starts at byte 6, after the magic byte and 4-byte id.
        decoded = from_avro(F.expr("substring(value, 6)"), args.avro_schema).alias("r")
    else:
        decoded = F.from_json(F.col("value").cast("string"), schema).alias("r")
    rows = records.select(decoded).select("r.*").where(F.col("amount") >= args.min_amount).select(*projected)
    batches = []

    def write(frame, batch_id):  # type: ignore[no-untyped-def]
        frame.write.mode("overwrite").parquet(f"{args.out}/batch={batch_id}")
        batches.append(batch_id)

    started = time.perf_counter()
    stream = rows.writeStream.option("checkpointLocation", args.checkpoint).trigger(availableNow=True)
    if args.delta:
        query = stream.format("delta").outputMode("append").start(args.out)
    elif args.file_sink:
        query = stream.format("parquet").outputMode("append").start(args.out)
    else:
        query = stream.foreachBatch(write).start()
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    if args.delta:
        written = spark.read.format("delta").load(args.out).count()
        batches = [p for p in query.recentProgress if p.numInputRows]
    elif args.file_sink:
        written = spark.read.parquet(args.out).count()  # the files the _spark_metadata log holds
        batches = [p for p in query.recentProgress if p.numInputRows]
    else:
        written = spark.read.parquet(args.out).count()
    spark.stop()
    print(json.dumps({"processing_s": elapsed, "rows": written, "batches": len(batches)}))


if __name__ == "__main__":
    main()

"""Run each peer once over a data set: end-to-end wall time, in-job processing time, rows, peak memory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from bench.dataset import MIN_AMOUNT, Dataset, create_topic, delete_topics, kept
from bench.memory import TreePeak, TreeSampler
from bench.peers.setup import (
    DELTA_SPARK_CONF,
    HERE,
    quix_python,
    spark_avro_jars,
    spark_delta_jars,
    spark_kafka_jars,
    spark_s3a_jars,
)
from bench.sinks_check import delete_location
from onceflow.config import Settings
from onceflow.engine.submit import spark_environment


@dataclass(frozen=True)
class PeerRun:
    name: str
    records: int
    wall_s: float
    processing_s: float
    outputs: int
    memory: TreePeak

    @property
    def records_per_s(self) -> float:
        return self.records / self.wall_s


class PeerFailed(RuntimeError):
    pass


def _run(name: str, command: list[str], env: dict[str, str], data: Dataset) -> tuple[float, dict, TreePeak]:
    sampler = TreeSampler(os.getpid()).start()
    started = time.perf_counter()
    try:
        result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    finally:
        memory = sampler.stop()
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise PeerFailed(f"{name} exited {result.returncode}: {result.stderr[-3000:]}")
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    return wall, summary, memory


def structured_streaming(
    settings: Settings,
    data: Dataset,
    workdir: Path,
    batch: int,
    avro_schema: str | None = None,
    *,
    nested: bool = False,
    delta: bool = False,
    s3: str | None = None,
) -> PeerRun:
    """spark-submit the Structured Streaming job with the same master and settings as onceflow's slices.

    ``avro_schema`` (JSON text): the topic holds Avro in the registry wire format, read with ``from_avro``.
    ``nested``: the topic holds the nested data set (as JSON, or as Avro with ``avro_schema``).
    ``delta``: the job writes with Structured Streaming's Delta sink (delta-spark) instead of foreachBatch.
    ``s3``: an ``s3://bucket/prefix`` under which the job writes Parquet with Spark's file sink through
    S3A (its checkpoint stays in ``workdir``, as onceflow's ledger does); the rows of the files its
    ``_spark_metadata`` log commits are then counted here, through the bucket, and the prefix deleted.
    """
    run_id = f"sss-{uuid.uuid4().hex[:8]}"
    run_dir = workdir / run_id
    out_url = f"{s3.rstrip('/')}/{run_id}" if s3 else None
    out = "s3a://" + out_url.removeprefix("s3://") if out_url else str(run_dir / "out")
    jars = [
        *spark_kafka_jars(),
        *(spark_avro_jars() if avro_schema else []),
        *(spark_delta_jars() if delta else []),
        *(spark_s3a_jars() if s3 else []),
    ]
    conf = {**DELTA_SPARK_CONF} if delta else {}
    delta_conf = [part for key, value in conf.items() for part in ("--conf", f"{key}={value}")]
    command = [
        "spark-submit",
        "--master", "local[2]",
        "--conf", "spark.ui.enabled=false",
        "--conf", "spark.sql.shuffle.partitions=4",
        *delta_conf,
        "--jars", ",".join(str(j) for j in jars),
        str(HERE / "spark_streaming_job.py"),
        "--bootstrap", settings.kafka_bootstrap,
        "--topic", data.topic,
        "--out", out,
        "--checkpoint", str(run_dir / "checkpoint"),
        "--max-offsets", str(batch),
        "--min-amount", str(MIN_AMOUNT),
        *(["--avro-schema", avro_schema] if avro_schema else []),
        *(["--nested"] if nested else []),
        *(["--delta"] if delta else []),
        *(["--file-sink"] if s3 else []),
    ]  # fmt: skip
    env = spark_environment(settings)  # with the AWS variables, which the job's S3A settings read
    env["PYTHONPATH"] = os.pathsep.join(p for p in [*sys.path, env.get("PYTHONPATH", "")] if p)
    try:
        wall, summary, memory = _run("Structured Streaming", command, env, data)
        if out_url:
            counted = file_sink_rows(settings, out_url)
            if counted != summary["rows"]:
                raise PeerFailed(
                    f"Structured Streaming counted {summary['rows']} rows; its file sink's log commits "
                    f"files of {counted}"
                )
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
        if out_url:
            delete_location(out_url, settings)
    if summary["rows"] != kept(data.records):
        raise PeerFailed(f"Structured Streaming wrote {summary['rows']} rows, expected {kept(data.records)}")
    suffixes = (("_nested", nested), ("_avro", avro_schema), ("_delta", delta), ("_s3", s3))
    name = "spark_structured_streaming" + "".join(suffix for suffix, on in suffixes if on)
    return PeerRun(name, data.records, wall, summary["processing_s"], summary["rows"], memory)


def file_sink_rows(settings: Settings, url: str) -> int:
    """Rows of the Parquet files that the ``_spark_metadata`` log of Spark's file sink at ``url`` (an
    ``s3://`` URL) commits, read through the bucket: a reader of the sink's output sees these files only.

    The log holds a file per batch (``N``, or ``N.compact`` every 10th, repeating the earlier entries);
    each is a version line, then a JSON line per file; the streaming sink only adds."""
    import pyarrow.parquet as pq
    from pyarrow import fs as pafs

    if settings.s3 is None:
        raise PeerFailed("no object store settings (AWS_ENDPOINT_URL, ...) to read the file sink's log")
    filesystem = settings.s3.filesystem()
    root = url.removeprefix("s3://").rstrip("/")
    entries = filesystem.get_file_info(pafs.FileSelector(f"{root}/_spark_metadata"))
    files: set[str] = set()
    for entry in entries:
        if entry.type != pafs.FileType.File or entry.base_name.startswith("."):
            continue
        with filesystem.open_input_stream(entry.path) as stream:
            version, *lines = stream.read().decode().splitlines()
        if version != "v1":
            raise PeerFailed(f"{entry.path}: unknown file sink log version {version!r}")
        for line in lines:
            added = json.loads(line)
            if added.get("action", "add") != "add":
                raise PeerFailed(f"{entry.path}: the file sink log removes {added['path']}")
            files.add(added["path"].removeprefix("s3a://"))
    if not files:
        raise PeerFailed(f"{url}: the file sink log commits no file")
    rows = 0
    for path in sorted(files):
        with filesystem.open_input_file(path) as file:
            rows += pq.ParquetFile(file).metadata.num_rows  # the footer's count, as for onceflow's files
    return rows


def quix(settings: Settings, data: Dataset) -> PeerRun:
    """Run the quix-streams application in its own virtualenv until it has produced every output."""
    output_topic = create_topic(settings.kafka_bootstrap, "bench-quix-out")
    expected = kept(data.records)
    command = [
        str(quix_python()),
        str(HERE / "quix_app.py"),
        "--bootstrap", settings.kafka_bootstrap,
        "--topic", data.topic,
        "--output-topic", output_topic,
        "--group", f"bench-quix-{uuid.uuid4().hex[:8]}",
        "--outputs", str(expected),
        "--min-amount", str(MIN_AMOUNT),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    try:
        wall, summary, memory = _run("quix-streams", command, env, data)
        produced = _count_committed(settings.kafka_bootstrap, output_topic)
    finally:
        delete_topics(settings.kafka_bootstrap, [output_topic])
    if produced != expected:
        raise PeerFailed(f"quix-streams committed {produced} output records, expected {expected}")
    return PeerRun("quix_streams", data.records, wall, summary["processing_s"], produced, memory)


def _count_committed(bootstrap: str, topic: str) -> int:
    """Records a read_committed consumer sees in ``topic`` (what downstream readers would get)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "onceflow-bench-count",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        left, count = len(partitions), 0
        while left:
            for message in consumer.consume(10_000, timeout=1.0):
                error = message.error()
                if error is None:
                    count += 1
                elif error.code() == KafkaError._PARTITION_EOF:
                    left -= 1
                else:
                    raise PeerFailed(f"counting {topic}: {error}")
        return count
    finally:
        consumer.close()

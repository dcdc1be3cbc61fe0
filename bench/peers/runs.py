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
)
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
) -> PeerRun:
    """spark-submit the Structured Streaming job with the same master and settings as onceflow's slices.

    ``avro_schema`` (JSON text): the topic holds Avro in the registry wire format, read with ``from_avro``.
    ``nested``: the topic holds the nested data set (as JSON, or as Avro with ``avro_schema``).
    ``delta``: the job writes with Structured Streaming's Delta sink (delta-spark) instead of foreachBatch.
    """
    run_dir = workdir / f"sss-{uuid.uuid4().hex[:8]}"
    jars = [
        *spark_kafka_jars(),
        *(spark_avro_jars() if avro_schema else []),
        *(spark_delta_jars() if delta else []),
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
        "--out", str(run_dir / "out"),
        "--checkpoint", str(run_dir / "checkpoint"),
        "--max-offsets", str(batch),
        "--min-amount", str(MIN_AMOUNT),
        *(["--avro-schema", avro_schema] if avro_schema else []),
        *(["--nested"] if nested else []),
        *(["--delta"] if delta else []),
    ]  # fmt: skip
    env = spark_environment(settings)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [*sys.path, env.get("PYTHONPATH", "")] if p)
    try:
        wall, summary, memory = _run("Structured Streaming", command, env, data)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    if summary["rows"] != kept(data.records):
        raise PeerFailed(f"Structured Streaming wrote {summary['rows']} rows, expected {kept(data.records)}")
    suffixes = (("_nested", nested), ("_avro", avro_schema), ("_delta", delta))
    name = "spark_structured_streaming" + "".join(suffix for suffix, on in suffixes if on)
    return PeerRun(name, data.records, wall, summary["processing_s"], summary["rows"], memory)


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
